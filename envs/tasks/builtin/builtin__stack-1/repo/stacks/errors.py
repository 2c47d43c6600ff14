class EmptyStackError(LookupError):
    """Raised by Stack.pop() and Stack.peek() on an empty stack."""
