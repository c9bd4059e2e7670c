"""A table of contents for a Markdown document: its headings, their levels and anchors."""

import re


def headings(markdown):
    """(level, title) for each ATX heading ("## Title"), skipping fenced code blocks."""
    found = []
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code or not line.startswith("#"):
            continue
        level = line.count("#")
        title = line.lstrip("#").strip()
        if 1 <= level <= 6 and title:
            found.append((level, title))
    return found


def anchor(title):
    """GitHub-style anchor: lower case, punctuation dropped, spaces as dashes."""
    slug = re.sub(r"[^\w\- ]", "", title.lower())
    return slug.replace(" ", "-")


def table_of_contents(markdown, max_level=3):
    """A nested Markdown list of links, two spaces of indent per level below the first."""
    lines = []
    for level, title in headings(markdown):
        if level <= max_level:
            lines.append(f"{'  ' * (level - 1)}- [{title}](#{anchor(title)})")
    return "\n".join(lines)
