"""Roman numerals for 1..3999."""

_TABLE = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"),
    (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
    (10, "X"), (9, "IX"), (5, "V"), (1, "I"),
]
_VALUES = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}


def to_roman(number: int) -> str:
    if not 0 < number < 4000:
        raise ValueError(f"out of range: {number}")
    parts = []
    for value, numeral in _TABLE:
        count, number = divmod(number, value)
        parts.append(numeral * count)
    return "".join(parts)


def from_roman(text: str) -> int:
    text = text.upper()
    total = 0
    for i, char in enumerate(text):
        value = _VALUES[char]
        if i + 1 < len(text) and value < _VALUES[text[i + 1]]:
            total -= value
        else:
            total += value
    return total
