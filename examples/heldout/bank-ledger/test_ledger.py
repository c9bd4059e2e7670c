from datetime import date

import pytest

from ledger import balance, largest_withdrawal, month_key, monthly_totals

TX = [
    (date(2024, 3, 1), "deposit", 250000),
    (date(2024, 3, 5), "withdrawal", 80000),
    (date(2024, 3, 20), "withdrawal", 12550),
    (date(2024, 4, 1), "deposit", 250000),
]


def test_balance():
    assert balance(TX) == 250000 - 80000 - 12550 + 250000


def test_balance_with_opening_amount():
    assert balance(TX[:2], opening=1000) == 1000 + 250000 - 80000


def test_unknown_kind():
    with pytest.raises(ValueError):
        balance([(date(2024, 1, 1), "refund", 5)])


def test_month_key_is_zero_padded():
    assert month_key(date(2024, 3, 9)) == "2024-03"
    assert month_key(date(2024, 11, 30)) == "2024-11"


def test_monthly_totals():
    assert monthly_totals(TX) == {"2024-03": (250000, 92550), "2024-04": (250000, 0)}


def test_largest_withdrawal():
    assert largest_withdrawal(TX) == 80000
    assert largest_withdrawal([]) == 0
