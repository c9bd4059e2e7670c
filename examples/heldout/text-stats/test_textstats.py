from textstats import average_word_length, reading_minutes, sentence_count, words

TEXT = "The cat sat.  Did it stay?\nIt did!"


def test_words_ignore_runs_of_spaces_and_newlines():
    assert words(TEXT) == ["The", "cat", "sat", "Did", "it", "stay", "It", "did"]


def test_sentences():
    assert sentence_count(TEXT) == 3


def test_ellipsis_is_one_sentence_end():
    assert sentence_count("Well... maybe.") == 2


def test_average_word_length():
    assert average_word_length("a bb ccc") == 2.0
    assert average_word_length("") == 0.0


def test_reading_minutes():
    assert reading_minutes("word " * 450) == 2
    assert reading_minutes("short") == 1
    assert reading_minutes("") == 0
