"""Statistics over a web server's access log (common log format)."""

import re

LINE = re.compile(
    r'(?P<host>\S+) \S+ \S+ \[(?P<time>[^\]]+)\] "(?P<method>[A-Z]+) (?P<path>\S+) [^"]*" '
    r"(?P<status>\d{3}) (?P<size>\d+|-)"
)


def parse_line(line):
    """A dict with host, time, method, path, status (int) and size (int), or None."""
    match = LINE.match(line)
    if match is None:
        return None
    entry = match.groupdict()
    entry["status"] = int(entry["status"])
    entry["size"] = 0 if entry["size"] == "-" else int(entry["size"])
    return entry


def status_counts(lines):
    """How many requests ended with each status code. Malformed lines are skipped."""
    counts = {}
    for line in lines:
        entry = parse_line(line)
        if entry is None:
            continue
        counts[entry["status"]] += 1
    return counts


def error_rate(lines):
    """The share of requests answered with a 5xx status, 0.0 when there are none."""
    counts = status_counts(lines)
    total = sum(counts.values())
    if total == 0:
        return 0.0
    errors = sum(n for status, n in counts.items() if 500 <= status < 600)
    return errors / total
