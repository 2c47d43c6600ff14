import pytest

from billsplit import split_evenly


def test_even_amount():
    assert split_evenly(900, 3) == [300, 300, 300]


def test_one_person():
    assert split_evenly(1234, 1) == [1234]


def test_nobody():
    with pytest.raises(ValueError):
        split_evenly(100, 0)
