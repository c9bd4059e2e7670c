"""Rolling statistics over evenly spaced sensor readings."""


def rolling_mean(readings, window):
    """Mean of every run of `window` consecutive readings, in order.

    rolling_mean([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]
    """
    if window <= 0:
        raise ValueError("window must be positive")
    if window > len(readings):
        return []
    means = []
    for start in range(len(readings) - window):
        chunk = readings[start:start + window]
        means.append(sum(chunk) / window)
    return means


def peak_window(readings, window):
    """(start index, mean) of the window with the highest mean, or None if there is none."""
    means = rolling_mean(readings, window)
    if not means:
        return None
    best = max(range(len(means)), key=lambda i: means[i])
    return best, means[best]


def smooth(readings, window):
    """The readings with each point replaced by the mean of the window that ends at it.

    The first `window - 1` points have no full window before them and are kept as they are,
    so the result is as long as the input.
    """
    means = rolling_mean(readings, window)
    return list(readings[:window - 1]) + means
