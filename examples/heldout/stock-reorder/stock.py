"""Which products a small shop has to reorder, and how many of each."""


def needs_reorder(item):
    """item: dict with "stock" and "reorder_level". Reorder once stock is down to the level."""
    return item["stock"] < item["reorder_level"]


def reorder_quantity(item):
    """Enough to bring the stock back up to "target", in whole packs of "pack_size"."""
    missing = item["target"] - item["stock"]
    if missing <= 0:
        return 0
    packs = -(-missing // item["pack_size"])
    return packs * item["pack_size"]


def reorder_list(items):
    """name -> quantity to order, for every item that needs it, sorted by name."""
    orders = {}
    for item in sorted(items, key=lambda i: i["name"]):
        if needs_reorder(item):
            orders[item["name"]] = reorder_quantity(item)
    return orders


def stock_value(items):
    """The stock's value in cents: stock times unit cost, summed."""
    return sum(item["stock"] * item["unit_cents"] for item in items)
