"""Compare release versions like '1.10.2' or 'v2.0' for an update checker."""


def parse_version(text):
    """'v1.10.2' -> (1, 10, 2). A leading 'v' and surrounding spaces are allowed."""
    text = text.strip()
    if text.startswith(("v", "V")):
        text = text[1:]
    parts = text.split(".")
    if not parts or not all(part.isdigit() for part in parts):
        raise ValueError(f"not a version: {text!r}")
    return tuple(part for part in parts)


def is_newer(candidate, current):
    """Whether `candidate` is a later release than `current`."""
    return parse_version(candidate) > parse_version(current)


def latest(versions):
    """The latest of the given versions, as written; None for an empty list."""
    if not versions:
        return None
    return max(versions, key=parse_version)


def update_message(current, available):
    """What the update checker tells the user."""
    newest = latest(available)
    if newest is None or not is_newer(newest, current):
        return f"{current} is up to date"
    return f"update available: {current} -> {newest}"
