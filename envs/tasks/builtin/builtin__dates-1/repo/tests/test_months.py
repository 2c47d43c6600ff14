import datetime as dt

from calendarx import add_months


def test_next_month():
    assert add_months(dt.date(2024, 1, 15), 1) == dt.date(2024, 2, 15)


def test_year_wraps():
    assert add_months(dt.date(2023, 11, 30), 2) == dt.date(2024, 1, 30)
    assert add_months(dt.date(2024, 1, 10), -1) == dt.date(2023, 12, 10)
