import pytest

from booking import Booking, book, free_rooms, has_conflict

DAY = [
    Booking("atlas", 9 * 60, 10 * 60),
    Booking("atlas", 13 * 60, 14 * 60),
    Booking("borealis", 9 * 60, 12 * 60),
]


def test_a_booking_must_end_after_it_starts():
    with pytest.raises(ValueError):
        Booking("atlas", 600, 600)


def test_conflict_with_the_first_booking():
    assert has_conflict(Booking("atlas", 9 * 60 + 30, 11 * 60), DAY)


def test_conflict_with_a_later_booking():
    assert has_conflict(Booking("atlas", 13 * 60 + 30, 15 * 60), DAY)
    assert has_conflict(Booking("borealis", 11 * 60, 11 * 60 + 30), DAY)


def test_back_to_back_is_fine():
    assert not has_conflict(Booking("atlas", 10 * 60, 13 * 60), DAY)


def test_book_refuses_a_double_booking():
    day = list(DAY)
    assert not book(Booking("borealis", 10 * 60, 10 * 60 + 30), day)
    assert book(Booking("cosmos", 10 * 60, 10 * 60 + 30), day)
    assert len(day) == 4


def test_free_rooms():
    rooms = ["atlas", "borealis", "cosmos"]
    assert free_rooms(rooms, 11 * 60, 12 * 60, DAY) == ["atlas", "cosmos"]
    assert free_rooms(rooms, 13 * 60, 13 * 60 + 15, DAY) == ["borealis", "cosmos"]
