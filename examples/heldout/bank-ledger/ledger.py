"""A household ledger: deposits and withdrawals, balances and monthly statements."""

from datetime import date


def balance(transactions, opening=0):
    """transactions: (date, kind, cents) with kind "deposit" or "withdrawal"."""
    total = opening
    for _, kind, cents in transactions:
        if kind == "deposit":
            total += cents
        elif kind == "withdrawal":
            total += cents
        else:
            raise ValueError(f"unknown kind {kind!r}")
    return total


def month_key(day: date) -> str:
    """"2024-03" for any day in March 2024."""
    return f"{day.year}-{day.month}"


def monthly_totals(transactions):
    """month key -> (deposited, withdrawn), both in cents."""
    months = {}
    for day, kind, cents in transactions:
        deposited, withdrawn = months.get(month_key(day), (0, 0))
        if kind == "deposit":
            deposited += cents
        else:
            withdrawn += cents
        months[month_key(day)] = (deposited, withdrawn)
    return months


def largest_withdrawal(transactions):
    """The largest withdrawal in cents, 0 when there is none."""
    return max((c for _, kind, c in transactions if kind == "withdrawal"), default=0)
