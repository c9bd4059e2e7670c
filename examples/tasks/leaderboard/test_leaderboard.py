from leaderboard import ranks, record_score, standings, top


def test_highest_score_first():
    assert standings({"mia": 120, "leo": 340, "ana": 90}) == [("leo", 340), ("mia", 120), ("ana", 90)]


def test_ties_in_alphabetical_order():
    scores = {"zoe": 500, "bob": 500, "kim": 700, "amy": 500}
    assert standings(scores) == [("kim", 700), ("amy", 500), ("bob", 500), ("zoe", 500)]


def test_top_cuts_between_tied_players():
    assert top({"carl": 10, "ben": 10, "abe": 10}, 2) == [("abe", 10), ("ben", 10)]


def test_ranks_share_and_skip():
    assert ranks({"a": 5, "b": 9, "c": 5, "d": 1}) == {"b": 1, "a": 2, "c": 2, "d": 4}


def test_record_score_keeps_the_best():
    scores = {"ana": 50}
    assert not record_score(scores, "ana", 40)
    assert record_score(scores, "ana", 75)
    assert record_score(scores, "new", 1)
    assert scores == {"ana": 75, "new": 1}
