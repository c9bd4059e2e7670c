import pytest

from versions import is_newer, latest, parse_version, update_message


def test_parse_version():
    assert parse_version(" v1.10.2 ") == (1, 10, 2)


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_version("1.x")


def test_simple_comparisons():
    assert is_newer("1.3.0", "1.2.9")
    assert not is_newer("1.2.3", "1.2.3")


def test_two_digit_components():
    assert is_newer("1.10.0", "1.9.0")
    assert is_newer("10.0", "9.4")


def test_latest():
    assert latest(["1.2", "1.10", "1.9"]) == "1.10"
    assert latest([]) is None


def test_update_message():
    assert update_message("2.9.1", ["2.8.0", "2.10.0"]) == "update available: 2.9.1 -> 2.10.0"
    assert update_message("3.0", ["2.10.0"]) == "3.0 is up to date"
