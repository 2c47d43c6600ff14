from datefmt.parse import parse_date

__all__ = ["parse_date"]
