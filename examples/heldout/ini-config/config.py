"""A small reader for INI-style settings files.

    [server]
    host = example.org
    port = 8080   ; a comment
"""


def parse(text):
    """Sections -> {key: value}. Keys outside any section go into the "" section."""
    sections = {"": {}}
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith((";", "#")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-2].strip()
            sections.setdefault(current, {})
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"not a setting: {raw!r}")
        value = value.split(";", 1)[0]
        sections[current][key.strip()] = value.strip()
    return sections


def get_int(sections, section, key, default=None):
    """The setting as an int, or `default` when it is missing."""
    value = sections.get(section, {}).get(key)
    if value is None:
        return default
    return int(value)


def get_bool(sections, section, key, default=False):
    """yes/no, true/false, on/off and 1/0, in any case."""
    value = sections.get(section, {}).get(key)
    if value is None:
        return default
    return value.lower() in ("yes", "true", "on", "1")
