import pytest

from miniargs import ArgError, parse_args

OPTIONS = {"count": int, "out": str, "verbose": bool}


def test_values_flags_and_positionals():
    values, rest = parse_args(["a.txt", "--count", "3", "--verbose", "b.txt"], OPTIONS)
    assert values == {"count": 3, "out": None, "verbose": True}
    assert rest == ["a.txt", "b.txt"]


def test_unknown_option():
    with pytest.raises(ArgError):
        parse_args(["--colour", "red"], OPTIONS)


def test_missing_value():
    with pytest.raises(ArgError):
        parse_args(["--out"], OPTIONS)
