"""Read slices of safetensors tensors with `os.pread` of exactly their byte ranges.

A safetensors file is an 8-byte little-endian header length, a JSON header (dtype, shape,
data_offsets of every tensor) and the raw row-major data. A slice along dim 0 is one byte range;
a slice along a later dim is one range per index of the dims before it. Nothing is memory-mapped,
so a host that needs 1/N of a tensor reads 1/N of its bytes (`bytes_read` counts them).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_bytes_read = 0


def bytes_read() -> int:
    """Tensor bytes this process has read with `SafetensorsFile.read` so far."""
    return _bytes_read


class SafetensorsFile:
    """One safetensors file: its tensors' names, shapes and dtypes, and reads of their slices."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with self.path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        header.pop("__metadata__", None)
        self._data_start = 8 + size
        self._tensors = header
        self._fd: int | None = None

    def keys(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name]["shape"])

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """Tensor `name`'s region `index` (one step-1 slice per dim, bounds already normalized)."""
        info = self._tensors[name]
        dtype = np.dtype(_DTYPES[info["dtype"]])
        shape = tuple(info["shape"])
        out = np.empty(tuple(s.stop - s.start for s in index), dtype)
        if out.size == 0:
            return out
        base = self._data_start + info["data_offsets"][0]
        buf = memoryview(out.reshape(-1).view(np.uint8))
        for n, (offset, length) in enumerate(_ranges(shape, index, dtype.itemsize)):
            self._pread(buf[n * length : (n + 1) * length], base + offset)
        return out

    def _pread(self, buf: memoryview, offset: int) -> None:
        global _bytes_read
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        done = 0
        while done < len(buf):
            got = os.preadv(self._fd, [buf[done:]], offset + done)
            if got == 0:
                raise OSError(f"{self.path}: truncated (tensor data past the end of the file)")
            done += got
        _bytes_read += done

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _ranges(shape: tuple[int, ...], index: tuple[slice, ...], itemsize: int):
    """(byte offset, length) of each contiguous run of a row-major region, in row-major order."""
    if not shape:
        yield 0, itemsize
        return
    partial = [d for d, (s, n) in enumerate(zip(index, shape, strict=True)) if (s.start, s.stop) != (0, n)]
    k = partial[-1] if partial else 0  # dims after k are whole: each run spans dim k's slice
    inner = math.prod(shape[k + 1 :])
    length = (index[k].stop - index[k].start) * inner * itemsize
    strides = [math.prod(shape[d + 1 :]) * itemsize for d in range(len(shape))]
    for outer in itertools.product(*(range(s.start, s.stop) for s in index[:k])):
        offset = sum(i * st for i, st in zip(outer, strides, strict=False)) + index[k].start * strides[k]
        yield offset, length
