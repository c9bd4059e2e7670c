from invoice import discounted, invoice_total, line_total, subtotal, tax

LINES = [
    ("notebook", 450, 2),
    ("pen", 120, 5),
    ("stapler", 1299, 1),
]


def test_line_total():
    assert line_total(("pen", 120, 5)) == 600


def test_subtotal_counts_every_line():
    assert subtotal(LINES) == 900 + 600 + 1299


def test_subtotal_of_one_line():
    assert subtotal([("pen", 120, 5)]) == 600


def test_ten_percent_discount():
    assert discounted(1000, 10) == 900


def test_discount_rounds_down():
    assert discounted(999, 15) == 850


def test_tax():
    assert tax(1000) == 200


def test_invoice_total():
    assert invoice_total(LINES, discount_percent=10) == 3024
