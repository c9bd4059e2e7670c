"""Meeting room bookings. Times are minutes since midnight; a booking is [start, end)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Booking:
    room: str
    start: int
    end: int

    def __post_init__(self):
        if self.end <= self.start:
            raise ValueError("a booking must end after it starts")


def overlaps(a, b):
    """Two bookings of the same room that share at least one minute."""
    return a.room == b.room and a.start < b.end and b.start < a.end


def has_conflict(booking, existing):
    """Whether `booking` overlaps any of the existing bookings."""
    for other in existing:
        if overlaps(booking, other):
            return True
        else:
            return False
    return False


def book(booking, existing):
    """Add the booking to `existing` unless it conflicts. Returns whether it was added."""
    if has_conflict(booking, existing):
        return False
    existing.append(booking)
    return True


def free_rooms(rooms, start, end, existing):
    """The rooms, in the given order, that are free for the whole of [start, end)."""
    return [room for room in rooms if not has_conflict(Booking(room, start, end), existing)]
