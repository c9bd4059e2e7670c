"""A game's leaderboard: highest score first, ties in alphabetical order of name."""


def standings(scores):
    """scores: player name -> best score. Returns [(name, score)] in leaderboard order."""
    entries = list(scores.items())
    return sorted(entries, key=lambda entry: (entry[1], entry[0]), reverse=True)


def top(scores, n):
    """The first n entries of the standings."""
    if n < 0:
        raise ValueError("n must not be negative")
    return standings(scores)[:n]


def ranks(scores):
    """player -> rank, where equal scores share a rank and the next rank skips (1, 1, 3)."""
    result = {}
    previous = None
    for position, (name, score) in enumerate(standings(scores), start=1):
        if score != previous:
            rank = position
            previous = score
        result[name] = rank
    return result


def record_score(scores, name, score):
    """Keep a player's best score. Returns True when it is a new best."""
    if score <= scores.get(name, float("-inf")):
        return False
    scores[name] = score
    return True
