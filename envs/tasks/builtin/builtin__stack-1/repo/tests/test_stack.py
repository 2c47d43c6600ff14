import pytest

from stacks import EmptyStackError, Stack


def test_push_pop_order():
    stack = Stack()
    stack.push(1)
    stack.push(2)
    assert stack.peek() == 2
    assert stack.pop() == 2 and stack.pop() == 1
    assert len(stack) == 0


def test_pop_empty():
    with pytest.raises(EmptyStackError):
        Stack().pop()
