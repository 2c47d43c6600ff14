import pytest

from lengths import UnitError, parse_length, to_meters


def test_parse_length():
    assert parse_length("12 cm") == pytest.approx(0.12)
    assert parse_length("3M") == pytest.approx(3.0)


def test_to_meters():
    assert to_meters(250, "mm") == pytest.approx(0.25)


def test_errors():
    with pytest.raises(UnitError):
        parse_length("12 parsecs")
    with pytest.raises(UnitError):
        parse_length("twelve cm")
