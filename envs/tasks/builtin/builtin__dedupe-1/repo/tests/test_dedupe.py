from listutil import dedupe


def test_removes_repeats():
    assert sorted(dedupe([3, 1, 3, 1])) == [1, 3]


def test_key_keeps_first_occurrence():
    assert dedupe(["Ada", "alan", "ADA"], key=str.lower) == ["Ada", "alan"]


def test_empty():
    assert dedupe([]) == []
