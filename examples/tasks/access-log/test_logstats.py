from logstats import error_rate, parse_line, status_counts

LOG = [
    '10.0.0.1 - - [12/Mar/2024:10:00:01 +0000] "GET /index.html HTTP/1.1" 200 5120',
    '10.0.0.2 - - [12/Mar/2024:10:00:02 +0000] "GET /missing HTTP/1.1" 404 -',
    '10.0.0.1 - - [12/Mar/2024:10:00:03 +0000] "POST /api/order HTTP/1.1" 500 87',
    "this line is garbage",
    '10.0.0.3 - - [12/Mar/2024:10:00:04 +0000] "GET /index.html HTTP/1.1" 200 5120',
]


def test_parse_line():
    entry = parse_line(LOG[0])
    assert entry["host"] == "10.0.0.1"
    assert entry["method"] == "GET"
    assert entry["path"] == "/index.html"
    assert (entry["status"], entry["size"]) == (200, 5120)


def test_parse_line_without_size():
    assert parse_line(LOG[1])["size"] == 0


def test_malformed_line():
    assert parse_line(LOG[3]) is None


def test_status_counts():
    assert status_counts(LOG) == {200: 2, 404: 1, 500: 1}


def test_empty_log():
    assert status_counts([]) == {}
    assert error_rate([]) == 0.0


def test_error_rate():
    assert error_rate(LOG) == 0.25
