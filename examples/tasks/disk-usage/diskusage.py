"""Disk usage of a directory tree, as a `du`-like tool reports it."""


class Node:
    """A file (children is None) or a directory (children is a list of Nodes)."""

    def __init__(self, name, size=0, children=None):
        self.name = name
        self.size = size
        self.children = children

    @property
    def is_dir(self):
        return self.children is not None


def total_size(node):
    """Bytes used by a file, or by everything below a directory."""
    if not node.children:
        return 0
    return sum(total_size(child) for child in node.children)


def count_files(node):
    if not node.is_dir:
        return 1
    return sum(count_files(child) for child in node.children)


def largest(node, n):
    """The n largest direct children of a directory as (name, total size), largest first."""
    sizes = [(child.name, total_size(child)) for child in node.children]
    sizes.sort(key=lambda pair: pair[1], reverse=True)
    return sizes[:n]


def human(size):
    """1536 -> '1.5K'; sizes below 1024 in bytes ('512B')."""
    for unit in ("B", "K", "M", "G"):
        if size < 1024 or unit == "G":
            return f"{size}B" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
