import pytest

from timesheet import format_duration, parse_duration, total_time


def test_parse_duration():
    assert parse_duration("1:02:05") == 3725


def test_parse_rejects_bad_minutes():
    with pytest.raises(ValueError):
        parse_duration("1:75:00")


def test_format_two_digit_fields():
    assert format_duration(45296) == "12:34:56"


def test_format_pads_minutes_and_seconds():
    assert format_duration(3725) == "1:02:05"
    assert format_duration(59) == "0:00:59"
    assert format_duration(36000) == "10:00:00"


def test_format_round_trip():
    for text in ("0:00:00", "3:09:08", "27:59:59"):
        assert format_duration(parse_duration(text)) == text


def test_total_time():
    entries = [("review", "0:45:30"), ("coding", "2:10:00"), ("review", "0:20:35")]
    assert total_time(entries) == {"coding": "2:10:00", "review": "1:06:05"}
