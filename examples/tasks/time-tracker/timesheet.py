"""Durations for a time-tracking tool, shown as H:MM:SS."""


def parse_duration(text):
    """'1:02:05' -> 3725 seconds. Minutes and seconds must be below 60."""
    parts = text.strip().split(":")
    if len(parts) != 3:
        raise ValueError(f"expected H:MM:SS, got {text!r}")
    hours, minutes, seconds = (int(p) for p in parts)
    if not (0 <= minutes < 60 and 0 <= seconds < 60) or hours < 0:
        raise ValueError(f"out of range: {text!r}")
    return hours * 3600 + minutes * 60 + seconds


def format_duration(total):
    """3725 seconds -> '1:02:05': hours as they are, minutes and seconds on two digits."""
    if total < 0:
        raise ValueError("a duration cannot be negative")
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes}:{seconds}"


def total_time(entries):
    """entries: list of (task, 'H:MM:SS'). Returns task -> total, formatted, tasks sorted."""
    totals = {}
    for task, text in entries:
        totals[task] = totals.get(task, 0) + parse_duration(text)
    return {task: format_duration(totals[task]) for task in sorted(totals)}
