from spans import merge


def test_disjoint_stay_apart():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_overlap_joins():
    assert merge([(1, 4), (3, 8)]) == [(1, 8)]


def test_nested_is_absorbed():
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]
