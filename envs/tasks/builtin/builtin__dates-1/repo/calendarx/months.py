"""Month arithmetic on dates."""

import datetime as dt


def add_months(day: dt.date, months: int) -> dt.date:
    """The same day of the month `months` later (or earlier), clamped to the month's end."""
    index = day.year * 12 + day.month - 1 + months
    year, month = divmod(index, 12)
    return day.replace(year=year, month=month + 1)
