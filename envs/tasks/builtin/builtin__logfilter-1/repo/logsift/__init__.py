from logsift.filter import filter_lines, parse_line
from logsift.levels import level_value

__all__ = ["filter_lines", "level_value", "parse_line"]
