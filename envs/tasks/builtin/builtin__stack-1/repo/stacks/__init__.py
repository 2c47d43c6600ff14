from stacks.errors import EmptyStackError
from stacks.stack import Stack

__all__ = ["EmptyStackError", "Stack"]
