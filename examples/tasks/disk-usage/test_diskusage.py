from diskusage import Node, count_files, human, largest, total_size


def tree():
    return Node("project", children=[
        Node("README.md", size=1200),
        Node("src", children=[
            Node("main.py", size=3000),
            Node("util", children=[Node("io.py", size=800)]),
        ]),
        Node("empty", children=[]),
        Node("logo.png", size=5000),
    ])


def test_a_single_file():
    assert total_size(Node("notes.txt", size=42)) == 42


def test_an_empty_directory():
    assert total_size(Node("tmp", children=[])) == 0


def test_a_whole_tree():
    assert total_size(tree()) == 10000


def test_count_files():
    assert count_files(tree()) == 4


def test_largest_children():
    assert largest(tree(), 2) == [("logo.png", 5000), ("src", 3800)]


def test_human_sizes():
    assert [human(512), human(1536), human(3 * 1024 ** 2)] == ["512B", "1.5K", "3.0M"]
