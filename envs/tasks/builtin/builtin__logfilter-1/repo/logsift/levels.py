"""Log levels and their severity."""

LEVELS = {
    "DEBUG": 10,
    "INFO": 20,
    "WARN": 30,
    "ERROR": 40,
    "CRITICAL": 50,
}


def level_value(name: str) -> int:
    try:
        return LEVELS[name.upper()]
    except KeyError:
        raise ValueError(f"unknown level: {name!r}") from None
