from toc import anchor, headings, table_of_contents

DOC = """# Guide
Some text.
## Install
```sh
# not a heading
```
## C# and F# notes
### Step #2
"""


def test_headings_and_levels():
    assert headings(DOC) == [(1, "Guide"), (2, "Install"), (2, "C# and F# notes"), (3, "Step #2")]


def test_code_blocks_are_skipped():
    assert (1, "not a heading") not in headings(DOC)


def test_anchor():
    assert anchor("Install") == "install"
    assert anchor("What's new?") == "whats-new"


def test_table_of_contents():
    assert table_of_contents("# A\n## B\n### C\n#### D\n") == (
        "- [A](#a)\n  - [B](#b)\n    - [C](#c)"
    )


def test_toc_with_a_hash_in_a_title():
    assert table_of_contents("# Tips\n## C# basics\n") == (
        "- [Tips](#tips)\n  - [C# basics](#c-basics)"
    )
