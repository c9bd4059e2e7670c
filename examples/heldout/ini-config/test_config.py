import pytest

from config import get_bool, get_int, parse

TEXT = """
name = demo
; the web server
[server]
host = example.org
port = 8080   ; default port

[features]
search = Yes
uploads = off
"""


def test_top_level_keys():
    assert parse(TEXT)[""] == {"name": "demo"}


def test_sections_are_named_as_written():
    assert sorted(parse(TEXT)) == ["", "features", "server"]


def test_values_and_comments():
    assert parse(TEXT)["server"] == {"host": "example.org", "port": "8080"}


def test_get_int():
    sections = parse(TEXT)
    assert get_int(sections, "server", "port") == 8080
    assert get_int(sections, "server", "timeout", 30) == 30


def test_get_bool():
    sections = parse(TEXT)
    assert get_bool(sections, "features", "search") is True
    assert get_bool(sections, "features", "uploads") is False


def test_a_line_without_equals_is_an_error():
    with pytest.raises(ValueError):
        parse("[a]\njust words\n")
