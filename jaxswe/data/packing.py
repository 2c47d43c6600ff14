"""Pack variable-length token sequences into [B, T] rows for the trainer.

Each sequence becomes one segment of a row: `segment_ids` number the segments 1, 2, ... within a
row (0 = padding), `positions` restart at 0 in each segment, `loss_mask` marks trained tokens
(the assistant's generated tokens), `old_logprobs` and `advantages` are per token so one row can
hold several trajectories. Token t's log-prob is log p(ids[t] | ids[:t]) (the model's
`token_logprobs` convention), so every array is aligned with `input_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BATCH_KEYS = ("input_ids", "positions", "segment_ids", "loss_mask", "old_logprobs", "advantages")


@dataclass(frozen=True)
class Sequence:
    """One trajectory's tokens and what the loss needs of it."""

    input_ids: np.ndarray  # int [L]
    loss_mask: np.ndarray  # float/bool [L]
    old_logprobs: np.ndarray | None = None  # float [L]; None -> zeros (SFT)
    advantage: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {n} tokens")
        if self.old_logprobs is not None and len(self.old_logprobs) != n:
            raise ValueError(f"old_logprobs has {len(self.old_logprobs)} entries for {n} tokens")


@dataclass(frozen=True)
class PackedBatch:
    """[B, T] arrays (keys BATCH_KEYS) plus where each sequence went."""

    arrays: dict[str, np.ndarray]
    placement: list[tuple[int, int, int]]  # per input sequence: (row, start, length kept)
    truncated: int  # sequences cut to fit seq_len

    @property
    def num_rows(self) -> int:
        return int(self.arrays["input_ids"].shape[0])

    def rows(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {k: v[start:stop] for k, v in self.arrays.items()}


def _round_rows(n: int, multiple: int, power_of_two: bool) -> int:
    n = max(n, 1)
    if power_of_two:
        n = 1 << (n - 1).bit_length()
    return -(-n // multiple) * multiple


def pack_sequences(
    sequences: list[Sequence], seq_len: int, *, rows_multiple: int = 1, power_of_two_rows: bool = True
) -> PackedBatch:
    """First-fit-decreasing packing into rows of `seq_len` tokens.

    A sequence longer than `seq_len` keeps its first `seq_len` tokens (counted in `truncated`).
    The row count is rounded up (to a power of two, then to `rows_multiple`) with empty rows,
    so that few distinct shapes reach the jitted train step.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    lengths = [min(len(s.input_ids), seq_len) for s in sequences]
    order = sorted(range(len(sequences)), key=lambda i: -lengths[i])
    row_fill: list[int] = []
    placement: list[tuple[int, int, int]] = [(0, 0, 0)] * len(sequences)
    for i in order:
        n = lengths[i]
        row = next((r for r, used in enumerate(row_fill) if used + n <= seq_len), None)
        if row is None:
            row_fill.append(0)
            row = len(row_fill) - 1
        placement[i] = (row, row_fill[row], n)
        row_fill[row] += n
    num_rows = _round_rows(len(row_fill), rows_multiple, power_of_two_rows)
    shape = (num_rows, seq_len)
    arrays = {
        "input_ids": np.zeros(shape, np.int32),
        "positions": np.zeros(shape, np.int32),
        "segment_ids": np.zeros(shape, np.int32),
        "loss_mask": np.zeros(shape, np.float32),
        "old_logprobs": np.zeros(shape, np.float32),
        "advantages": np.zeros(shape, np.float32),
    }
    segments_in_row = [0] * num_rows
    for i in sorted(range(len(sequences)), key=lambda i: placement[i][:2]):
        row, start, n = placement[i]
        seq = sequences[i]
        segments_in_row[row] += 1
        span = slice(start, start + n)
        arrays["input_ids"][row, span] = np.asarray(seq.input_ids[:n], np.int32)
        arrays["positions"][row, span] = np.arange(n, dtype=np.int32)
        arrays["segment_ids"][row, span] = segments_in_row[row]
        arrays["loss_mask"][row, span] = np.asarray(seq.loss_mask[:n], np.float32)
        if seq.old_logprobs is not None:
            arrays["old_logprobs"][row, span] = np.asarray(seq.old_logprobs[:n], np.float32)
        arrays["advantages"][row, span] = float(seq.advantage)
    # Position 0 of a segment has no prefix: it is never a trained token.
    arrays["loss_mask"][arrays["positions"] == 0] = 0.0
    truncated = sum(1 for s, n in zip(sequences, lengths, strict=True) if len(s.input_ids) > n)
    return PackedBatch(arrays=arrays, placement=placement, truncated=truncated)


def pad_rows(arrays: dict[str, np.ndarray], num_rows: int) -> dict[str, np.ndarray]:
    """Append empty rows (segment 0, no loss) so every array has `num_rows` rows."""
    have = len(arrays["input_ids"])
    if have > num_rows:
        raise ValueError(f"cannot pad {have} rows down to {num_rows}")
    return {
        k: np.concatenate([v, np.zeros((num_rows - have, *v.shape[1:]), v.dtype)]) for k, v in arrays.items()
    }


def split_rows(num_rows: int, num_steps: int) -> list[tuple[int, int]]:
    """Cut `num_rows` rows into `num_steps` contiguous, non-empty, near-equal [start, stop) spans."""
    num_steps = max(1, min(num_steps, num_rows))
    bounds = np.linspace(0, num_rows, num_steps + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def unpack_tokens(values_bt: np.ndarray, batch: PackedBatch, index: int) -> np.ndarray:
    """The [L] slice of a per-token [B, T] array that belongs to sequence `index`."""
    row, start, n = batch.placement[index]
    return values_bt[row, start : start + n]
