from qsparse import get_first, parse_qs


def test_pairs():
    assert parse_qs("a=1&b=2&a=3") == {"a": ["1", "3"], "b": ["2"]}


def test_leading_question_mark_and_flags():
    assert parse_qs("?debug&x=") == {"debug": [""], "x": [""]}


def test_get_first():
    assert get_first("page=2&page=3", "page") == "2"
    assert get_first("", "page", "1") == "1"
