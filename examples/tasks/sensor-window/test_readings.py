import pytest

from readings import peak_window, rolling_mean, smooth


def test_rolling_mean_of_pairs():
    assert rolling_mean([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]


def test_window_as_long_as_the_data():
    assert rolling_mean([2, 4, 6], 3) == [4.0]


def test_window_longer_than_the_data():
    assert rolling_mean([1, 2], 3) == []


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        rolling_mean([1, 2, 3], 0)


def test_peak_window_at_the_end():
    assert peak_window([1, 1, 5, 9], 2) == (2, 7.0)


def test_smooth_keeps_every_point():
    data = [10, 12, 14, 16, 18]
    assert smooth(data, 3) == [10, 12, 12.0, 14.0, 16.0]
