from miniargs.parser import ArgError, parse_args

__all__ = ["ArgError", "parse_args"]
