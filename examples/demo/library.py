"""Late fees for a small lending library."""

from datetime import date

DAILY_FEE_CENTS = 25
MAX_FEE_CENTS = 1000


def days_late(due: date, returned: date) -> int:
    """Whole days after the due date. Returning on (or before) the due date is not late."""
    return max((returned - due).days + 1, 0)


def late_fee(due: date, returned: date, member: bool = False) -> int:
    """25 cents per late day, capped at 10.00. Members pay half, rounded down to whole cents."""
    fee = min(days_late(due, returned) * DAILY_FEE_CENTS, MAX_FEE_CENTS)
    if member:
        fee = fee / 2
    return fee
