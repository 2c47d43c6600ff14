"""Converting between Celsius (C), Fahrenheit (F) and Kelvin (K)."""


def c_to_f(celsius: float) -> float:
    return celsius * 9 / 5 + 32


def f_to_c(fahrenheit: float) -> float:
    return (fahrenheit - 32) * 5 // 9


_TO_C = {"C": lambda v: v, "F": f_to_c, "K": lambda v: v - 273.15}
_FROM_C = {"C": lambda v: v, "F": c_to_f, "K": lambda v: v + 273.15}


def convert(value: float, src: str, dst: str) -> float:
    if src not in _TO_C or dst not in _FROM_C:
        raise ValueError(f"unknown unit: {src} or {dst}")
    return _FROM_C[dst](_TO_C[src](value))
