from ledger.money import format_money, round_money

__all__ = ["format_money", "round_money"]
