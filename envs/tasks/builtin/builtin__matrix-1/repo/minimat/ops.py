"""Matrices as lists of rows."""


def shape(m: list) -> tuple:
    return (len(m), len(m[0]) if m else 0)


def transpose(m: list) -> list:
    rows, cols = shape(m)
    return [[m[r][c] for r in range(rows)] for c in range(rows)]


def matmul(a: list, b: list) -> list:
    (n, k), (k2, p) = shape(a), shape(b)
    if k != k2:
        raise ValueError(f"shape mismatch: {shape(a)} @ {shape(b)}")
    return [[sum(a[i][t] * b[t][j] for t in range(k)) for j in range(p)] for i in range(n)]


def identity(n: int) -> list:
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]
