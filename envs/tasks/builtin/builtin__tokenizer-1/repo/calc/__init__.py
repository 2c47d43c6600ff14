from calc.tokens import TokenError, tokenize

__all__ = ["TokenError", "tokenize"]
