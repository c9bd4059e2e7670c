from stock import needs_reorder, reorder_list, reorder_quantity, stock_value

TEA = {"name": "tea", "stock": 4, "reorder_level": 5, "target": 20, "pack_size": 6, "unit_cents": 350}
COFFEE = {"name": "coffee", "stock": 5, "reorder_level": 5, "target": 12, "pack_size": 4, "unit_cents": 900}
SUGAR = {"name": "sugar", "stock": 30, "reorder_level": 10, "target": 40, "pack_size": 10, "unit_cents": 120}


def test_below_the_level():
    assert needs_reorder(TEA)


def test_at_the_level():
    assert needs_reorder(COFFEE)


def test_well_stocked():
    assert not needs_reorder(SUGAR)


def test_quantity_in_whole_packs():
    assert reorder_quantity(TEA) == 18
    assert reorder_quantity(COFFEE) == 8


def test_reorder_list():
    assert reorder_list([TEA, SUGAR, COFFEE]) == {"coffee": 8, "tea": 18}


def test_stock_value():
    assert stock_value([TEA, SUGAR]) == 4 * 350 + 30 * 120
