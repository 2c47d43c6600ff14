"""Length units and their size in meters."""

FACTORS = {
    "mm": 0.001,
    "cm": 0.01,
    "m": 1.0,
}


class UnitError(ValueError):
    pass


def to_meters(value: float, unit: str) -> float:
    try:
        return value * FACTORS[unit]
    except KeyError:
        raise UnitError(f"unknown unit: {unit!r}") from None
