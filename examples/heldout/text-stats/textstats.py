"""Simple statistics for a piece of prose: words, sentences, reading time."""

import re

WORDS_PER_MINUTE = 200


def words(text):
    """The words of `text`, punctuation around them removed."""
    found = []
    for token in text.split(" "):
        word = token.strip(".,;:!?\"'()")
        if word:
            found.append(word)
    return found


def sentence_count(text):
    """Sentences end with a full stop, a question mark or an exclamation mark."""
    return len(re.findall(r"[.]+(?=\s|$)", text))


def average_word_length(text):
    """Mean letters per word, to one decimal; 0.0 for an empty text."""
    ws = words(text)
    if not ws:
        return 0.0
    return round(sum(len(w) for w in ws) / len(ws), 1)


def reading_minutes(text):
    """Whole minutes to read `text` at WORDS_PER_MINUTE, at least 1 for any text."""
    n = len(words(text))
    if n == 0:
        return 0
    return max(1, round(n / WORDS_PER_MINUTE))
