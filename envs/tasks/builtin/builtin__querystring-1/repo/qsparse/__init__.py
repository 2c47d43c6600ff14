from qsparse.parse import get_first, parse_qs

__all__ = ["get_first", "parse_qs"]
