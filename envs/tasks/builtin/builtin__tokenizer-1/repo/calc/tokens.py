"""Split arithmetic expressions into ('NUM', value) and ('OP', symbol) tokens."""

import re

_TOKEN = re.compile(r"\s*(?:(\d+)|(\S))")


class TokenError(ValueError):
    pass


def tokenize(expr: str) -> list:
    tokens = []
    for number, symbol in _TOKEN.findall(expr):
        if number:
            tokens.append(("NUM", int(number)))
        elif symbol in "+-*/()":
            tokens.append(("OP", symbol))
        else:
            raise TokenError(f"unexpected character {symbol!r} in {expr!r}")
    return tokens
