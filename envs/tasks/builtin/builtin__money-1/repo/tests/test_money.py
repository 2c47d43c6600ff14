from decimal import Decimal

from ledger import format_money, round_money


def test_round_money():
    assert round_money("1.234") == Decimal("1.23")
    assert round_money("0.135") == Decimal("0.14")
    assert round_money(2) == Decimal("2.00")


def test_format_money():
    assert format_money(1234.5) == "1,234.50 USD"
    assert format_money("7", "EUR") == "7.00 EUR"
