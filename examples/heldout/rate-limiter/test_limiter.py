from limiter import RateLimiter


def test_allows_up_to_the_limit():
    rl = RateLimiter(limit=3, window=10)
    assert [rl.allow("a", t) for t in (0, 1, 2, 3)] == [True, True, True, False]


def test_keys_are_independent():
    rl = RateLimiter(limit=1, window=10)
    assert rl.allow("a", 0)
    assert rl.allow("b", 0)
    assert not rl.allow("a", 1)


def test_old_requests_leave_the_window():
    rl = RateLimiter(limit=2, window=10)
    assert rl.allow("a", 0) and rl.allow("a", 5)
    assert not rl.allow("a", 9)
    assert rl.allow("a", 10)


def test_remaining():
    rl = RateLimiter(limit=3, window=10)
    assert rl.remaining("a", 0) == 3
    rl.allow("a", 0)
    assert rl.remaining("a", 1) == 2


def test_reset():
    rl = RateLimiter(limit=1, window=10)
    rl.allow("a", 0)
    rl.reset("a")
    assert rl.allow("a", 1)
