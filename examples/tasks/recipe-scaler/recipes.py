"""Scale a recipe's ingredients to a different number of servings."""


def scale_quantity(quantity, servings, wanted):
    """The quantity for `wanted` servings, given `quantity` for `servings` servings.

    The result is exact (a float where needed); callers round it for display.
    """
    if servings <= 0 or wanted <= 0:
        raise ValueError("servings must be positive")
    return quantity * wanted // servings


def scale_recipe(recipe, wanted):
    """recipe: {'servings': n, 'ingredients': {name: (quantity, unit)}}.

    Returns a new recipe for `wanted` servings, quantities rounded to two decimals.
    """
    servings = recipe["servings"]
    ingredients = {}
    for name, (quantity, unit) in recipe["ingredients"].items():
        scaled = scale_quantity(quantity, servings, wanted)
        ingredients[name] = (round(scaled, 2), unit)
    return {"servings": wanted, "ingredients": ingredients}


def shopping_line(name, quantity, unit):
    """'flour: 300 g' or 'eggs: 1.5' (no unit); whole numbers without decimals."""
    amount = int(quantity) if float(quantity).is_integer() else quantity
    return f"{name}: {amount} {unit}".rstrip()
