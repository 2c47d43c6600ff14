"""Typed access to parsed configuration values."""

from confparse.parser import parse_lines

_TRUE = ("1", "true", "yes", "on")


class Config:
    def __init__(self, values: dict):
        self._values = dict(values)

    @classmethod
    def from_text(cls, text: str) -> "Config":
        return cls(parse_lines(text))

    def get(self, key: str, default=None):
        return self._values.get(key) or default

    def get_int(self, key: str, default: int = 0) -> int:
        value = self.get(key)
        return default if value is None else int(value)

    def get_bool(self, key: str, default: bool = False) -> bool:
        value = self.get(key)
        if value is None:
            return default
        return value.lower() in _TRUE
