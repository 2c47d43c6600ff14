from lengths.parse import parse_length
from lengths.units import UnitError, to_meters

__all__ = ["UnitError", "parse_length", "to_meters"]
