"""Money amounts as Decimal, rounded to cents."""

from decimal import Decimal

CENT = Decimal("0.01")


def to_decimal(amount) -> Decimal:
    if isinstance(amount, float):
        amount = repr(amount)
    return Decimal(amount)


def round_money(amount) -> Decimal:
    """Round to cents; halves are rounded away from zero (commercial rounding)."""
    return to_decimal(amount).quantize(CENT)


def format_money(amount, currency: str = "USD") -> str:
    return f"{round_money(amount):,.2f} {currency}"
