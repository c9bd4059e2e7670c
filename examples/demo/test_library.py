from datetime import date

from library import days_late, late_fee

DUE = date(2026, 3, 10)


def test_returned_on_the_due_date_is_not_late():
    assert days_late(DUE, DUE) == 0
    assert late_fee(DUE, DUE) == 0


def test_returned_early_costs_nothing():
    assert late_fee(DUE, date(2026, 3, 1)) == 0


def test_three_days_late():
    assert late_fee(DUE, date(2026, 3, 13)) == 75


def test_fee_is_capped():
    assert late_fee(DUE, date(2026, 6, 1)) == 1000


def test_members_pay_half_in_whole_cents():
    fee = late_fee(DUE, date(2026, 3, 13), member=True)
    assert fee == 37
    assert isinstance(fee, int)
