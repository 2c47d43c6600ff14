import datetime as dt

import pytest

from datefmt import parse_date


def test_iso():
    assert parse_date("2024-03-05") == dt.date(2024, 3, 5)


def test_slashes():
    assert parse_date(" 2024/12/31 ") == dt.date(2024, 12, 31)


def test_dotted_same_day_and_month():
    assert parse_date("01.01.2024") == dt.date(2024, 1, 1)


def test_garbage():
    with pytest.raises(ValueError):
        parse_date("yesterday")
