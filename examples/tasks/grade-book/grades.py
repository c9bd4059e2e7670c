"""Summaries of students' scores for a teacher's grade book."""

LETTERS = [(90, "A"), (80, "B"), (70, "C"), (60, "D")]


def letter_grade(score):
    for threshold, letter in LETTERS:
        if score >= threshold:
            return letter
    return "F"


def summarize(scores):
    """Count, mean, lowest and highest of a list of scores.

    A student with no scores yet has a count of 0 and None for the other three.
    """
    return {
        "count": len(scores),
        "mean": round(sum(scores) / len(scores), 1),
        "min": min(scores),
        "max": max(scores),
    }


def class_report(students):
    """students: name -> list of scores. Returns name -> (summary, letter grade or None)."""
    report = {}
    for name, scores in students.items():
        summary = summarize(scores)
        letter = None if summary["mean"] is None else letter_grade(summary["mean"])
        report[name] = (summary, letter)
    return report
