"""Peak normalisation and fades for mono audio given as lists of float samples."""


def peak(samples):
    """The largest absolute sample value, 0.0 for silence or no samples."""
    return max((abs(s) for s in samples), default=0.0)


def normalize(samples, target=1.0):
    """A copy of the samples scaled so that the peak is `target`.

    The caller's list is left as it was. Silence is returned unchanged (as a copy).
    """
    loudest = peak(samples)
    result = samples
    if loudest == 0:
        return list(samples)
    gain = target / loudest
    for i, sample in enumerate(result):
        result[i] = sample * gain
    return result


def fade_in(samples, length):
    """A copy with the first `length` samples ramped up linearly from silence."""
    out = list(samples)
    for i in range(min(length, len(out))):
        out[i] = out[i] * i / length
    return out


def prepare_clip(samples, target=0.9, fade=4):
    """Normalise, then fade in: what the editor does to each imported clip."""
    return fade_in(normalize(samples, target), fade)
