"""Invoice totals for a small web shop. Every amount is an integer number of cents."""

TAX_RATE_PERCENT = 20


def line_total(line):
    """A line is (description, unit price in cents, quantity)."""
    _, unit_cents, quantity = line
    return unit_cents * quantity


def subtotal(lines):
    """The sum of every line's total."""
    total = 0
    for i in range(len(lines) - 1):
        total += line_total(lines[i])
    return total


def discounted(amount, percent):
    """`amount` less `percent` per cent of it, rounded down to whole cents."""
    return amount - amount * percent // 10


def tax(amount):
    """The tax on `amount`, rounded down to whole cents."""
    return amount * TAX_RATE_PERCENT // 100


def invoice_total(lines, discount_percent=0):
    """Subtotal, less the discount, plus tax on what is left."""
    net = discounted(subtotal(lines), discount_percent)
    return net + tax(net)
