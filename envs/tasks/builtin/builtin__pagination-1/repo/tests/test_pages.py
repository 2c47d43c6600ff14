import pytest

from pager import page_count, page_slice


def test_page_count_exact():
    assert page_count(20, 10) == 2
    assert page_count(0, 10) == 0


def test_page_count_validates():
    with pytest.raises(ValueError):
        page_count(5, 0)


def test_page_slice():
    items = list(range(25))
    assert page_slice(items, 1, 10) == list(range(10))
    assert page_slice(items, 3, 10) == [20, 21, 22, 23, 24]
