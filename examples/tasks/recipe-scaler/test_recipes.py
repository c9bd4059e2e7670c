import pytest

from recipes import scale_quantity, scale_recipe, shopping_line

PANCAKES = {
    "servings": 4,
    "ingredients": {"flour": (200, "g"), "milk": (300, "ml"), "eggs": (2, ""), "sugar": (25, "g")},
}


def test_scale_up_evenly():
    assert scale_quantity(200, 4, 6) == 300


def test_scale_down_to_a_fraction():
    assert scale_quantity(1, 4, 2) == pytest.approx(0.5)
    assert scale_quantity(250, 3, 2) == pytest.approx(166.6667, rel=1e-4)


def test_servings_must_be_positive():
    with pytest.raises(ValueError):
        scale_quantity(100, 0, 2)


def test_scale_recipe():
    for_three = scale_recipe(PANCAKES, 3)
    assert for_three["servings"] == 3
    assert for_three["ingredients"] == {
        "flour": (150, "g"),
        "milk": (225, "ml"),
        "eggs": (1.5, ""),
        "sugar": (18.75, "g"),
    }


def test_shopping_line():
    assert shopping_line("flour", 300.0, "g") == "flour: 300 g"
    assert shopping_line("eggs", 1.5, "") == "eggs: 1.5"
