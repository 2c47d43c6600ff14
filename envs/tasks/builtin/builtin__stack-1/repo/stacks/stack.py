"""A last-in, first-out stack."""

from stacks.errors import EmptyStackError


class Stack:
    def __init__(self):
        self._items = []

    def push(self, item) -> None:
        self._items.append(item)

    def pop(self):
        if not self._items:
            raise EmptyStackError("pop from an empty stack")
        return self._items.pop()

    def peek(self):
        return self._items[-1]

    def __len__(self) -> int:
        return len(self._items)
