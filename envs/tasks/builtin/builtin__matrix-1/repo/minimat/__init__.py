from minimat.ops import identity, matmul, shape, transpose

__all__ = ["identity", "matmul", "shape", "transpose"]
