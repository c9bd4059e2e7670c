import pytest

from audio import fade_in, normalize, peak, prepare_clip


def test_peak():
    assert peak([0.1, -0.5, 0.25]) == 0.5
    assert peak([]) == 0.0


def test_normalize_scales_to_the_target():
    assert normalize([0.1, -0.5, 0.25]) == pytest.approx([0.2, -1.0, 0.5])


def test_normalize_leaves_the_input_alone():
    original = [0.1, -0.5, 0.25]
    normalize(original, target=0.5)
    assert original == [0.1, -0.5, 0.25]


def test_normalizing_the_same_clip_twice():
    clip = [0.2, 0.4, -0.1]
    assert normalize(clip, 0.8) == pytest.approx([0.4, 0.8, -0.2])
    assert normalize(clip, 0.4) == pytest.approx([0.2, 0.4, -0.1])
    assert normalize(clip, 0.8) is not clip


def test_silence():
    assert normalize([0.0, 0.0]) == [0.0, 0.0]


def test_prepare_clip_keeps_the_source():
    source = [0.5] * 6
    assert prepare_clip(source) == pytest.approx([0.0, 0.225, 0.45, 0.675, 0.9, 0.9])
    assert source == [0.5] * 6
