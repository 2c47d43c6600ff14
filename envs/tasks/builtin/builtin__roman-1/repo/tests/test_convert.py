import pytest

from romans import from_roman, to_roman


def test_to_roman():
    assert to_roman(2023) == "MMXXIII"
    assert to_roman(90) == "XC"


def test_from_roman():
    assert from_roman("MCMXCIV") == 1994
    assert from_roman("xlii") == 42


def test_out_of_range():
    with pytest.raises(ValueError):
        to_roman(0)
