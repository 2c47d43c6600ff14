from logsift import filter_lines, parse_line

LINES = [
    "2024-05-01 12:00:00 DEBUG cache miss",
    "2024-05-01 12:00:01 ERROR disk full",
    "not a log line",
]


def test_parse_line():
    assert parse_line(LINES[1]) == ("2024-05-01 12:00:01", "ERROR", "disk full")
    assert parse_line(LINES[2]) is None


def test_filter_more_severe():
    assert filter_lines(LINES, "INFO") == [LINES[1]]
