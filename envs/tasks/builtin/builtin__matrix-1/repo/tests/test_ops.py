import pytest

from minimat import identity, matmul, shape, transpose


def test_transpose_square():
    assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]


def test_matmul():
    assert matmul([[1, 2, 3]], [[1], [2], [3]]) == [[14]]
    assert matmul(identity(2), [[5, 6], [7, 8]]) == [[5, 6], [7, 8]]


def test_mismatch():
    with pytest.raises(ValueError):
        matmul([[1, 2]], [[1, 2]])


def test_shape():
    assert shape([[1, 2, 3], [4, 5, 6]]) == (2, 3)
