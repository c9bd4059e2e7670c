import pytest

from weather import (
    celsius_to_fahrenheit,
    daily_summary,
    fahrenheit_to_celsius,
    ms_to_kmh,
    wind_chill,
)


def test_boiling_point_in_fahrenheit():
    assert celsius_to_fahrenheit(100) == 212


def test_freezing_and_boiling_points_in_celsius():
    assert fahrenheit_to_celsius(32) == pytest.approx(0)
    assert fahrenheit_to_celsius(212) == pytest.approx(100)


@pytest.mark.parametrize("c", [-40, -3.5, 0, 21, 37])
def test_round_trip(c):
    assert fahrenheit_to_celsius(celsius_to_fahrenheit(c)) == pytest.approx(c)


def test_wind_speed():
    assert ms_to_kmh(10) == pytest.approx(36)


def test_no_wind_chill_when_warm():
    assert wind_chill(20, 30) == 20


def test_daily_summary():
    summary = daily_summary([(41, 2), (50, 5), (59, 3)])
    assert summary == {"min_c": 5.0, "max_c": 15.0, "mean_c": 10.0, "max_wind_kmh": 18.0}
