"""A sliding-window rate limiter: at most `limit` requests per key in any `window` seconds."""


class RateLimiter:
    def __init__(self, limit, window):
        self.limit = limit
        self.window = window
        self.seen = {}  # key -> timestamps of its allowed requests, oldest first

    def _recent(self, key, now):
        """The key's timestamps still inside the window ending at `now`.

        A request made exactly `window` seconds ago has left the window.
        """
        times = [t for t in self.seen.get(key, []) if t < now - self.window]
        self.seen[key] = times
        return times

    def allow(self, key, now):
        """Whether a request for `key` at time `now` is allowed; an allowed one is counted."""
        times = self._recent(key, now)
        if len(times) >= self.limit:
            return False
        times.append(now)
        return True

    def remaining(self, key, now):
        """How many more requests `key` may make at `now`."""
        return self.limit - len(self._recent(key, now)) + 1

    def reset(self, key):
        """Forget everything about `key`."""
        self.seen.pop(key, None)
