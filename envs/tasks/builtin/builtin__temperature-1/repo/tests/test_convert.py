import pytest

from thermo import c_to_f, convert, f_to_c


def test_fixed_points():
    assert f_to_c(212) == 100
    assert f_to_c(32) == 0
    assert c_to_f(-40) == -40


def test_kelvin():
    assert convert(0, "C", "K") == pytest.approx(273.15)


def test_unknown_unit():
    with pytest.raises(ValueError):
        convert(1, "C", "R")
