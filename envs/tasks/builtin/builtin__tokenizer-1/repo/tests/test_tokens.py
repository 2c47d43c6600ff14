import pytest

from calc import TokenError, tokenize


def test_integers_and_operators():
    assert tokenize("1 + 22*3") == [("NUM", 1), ("OP", "+"), ("NUM", 22), ("OP", "*"), ("NUM", 3)]


def test_parentheses():
    assert tokenize("(4)") == [("OP", "("), ("NUM", 4), ("OP", ")")]


def test_bad_character():
    with pytest.raises(TokenError):
        tokenize("2 $ 3")
