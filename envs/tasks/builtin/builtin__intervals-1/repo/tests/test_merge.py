from spans import merge, total_length


def test_overlapping():
    assert merge([[1, 3], [2, 6], [8, 10]]) == [[1, 6], [8, 10]]


def test_unsorted_input():
    assert merge([[8, 10], [1, 4], [2, 3]]) == [[1, 4], [8, 10]]


def test_total_length():
    assert total_length([[0, 5], [3, 7], [10, 11]]) == 8
