from grades import class_report, letter_grade, summarize


def test_letter_grades():
    assert [letter_grade(s) for s in (95, 90, 85, 72, 60, 59)] == ["A", "A", "B", "C", "D", "F"]


def test_summarize():
    assert summarize([70, 85, 91]) == {"count": 3, "mean": 82.0, "min": 70, "max": 91}


def test_summarize_one_score():
    assert summarize([64]) == {"count": 1, "mean": 64.0, "min": 64, "max": 64}


def test_summarize_no_scores():
    assert summarize([]) == {"count": 0, "mean": None, "min": None, "max": None}


def test_class_report_with_a_new_student():
    report = class_report({"ada": [88, 94], "new kid": []})
    assert report["ada"] == ({"count": 2, "mean": 91.0, "min": 88, "max": 94}, "A")
    assert report["new kid"] == ({"count": 0, "mean": None, "min": None, "max": None}, None)
