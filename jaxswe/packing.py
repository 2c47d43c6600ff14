"""Pack variable-length token sequences into [B, T] rows for the trainer.

Each sequence becomes one segment of a row: `segment_ids` number the segments 1, 2, ... within a
row (0 = padding), `positions` restart at 0 in each segment, `loss_mask` marks trained tokens
(the assistant's generated tokens), `rollout_logprobs` and `advantages` are per token so one row can
hold several trajectories. Token t's log-prob is log p(ids[t] | ids[:t]) (the model's
`token_logprobs` convention), so every array is aligned with `input_ids`.

`TokenBatch` is the one batch type of the trainer: packing fills it, the trainer adds the
recomputed `old_logprobs`, and the jitted SFT/DAPO steps take it (a NamedTuple is a pytree).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

# The [B, T] arrays of a batch: name -> (dtype, fill on padding and on tokens a field does not
# cover). TokenBatch, the packer, padding, the steps' inputs (`step_fields`) and the planner's batch
# bytes all follow this one table.
FIELDS: dict[str, tuple[type, int]] = {
    "input_ids": (np.int32, 0),
    "positions": (np.int32, 0),
    "segment_ids": (np.int32, 0),
    "loss_mask": (np.float32, 0),
    "advantages": (np.float32, 0),
    "rollout_logprobs": (np.float32, 0),
    "old_logprobs": (np.float32, 0),
    "policy_versions": (np.int32, -1),
}


class TokenBatch(NamedTuple):
    """[B, T] arrays of packed rows; a field a step does not use may be None."""

    input_ids: Any  # int32; 0 on padding
    positions: Any  # int32; restart at 0 in each segment
    segment_ids: Any  # int32; 1, 2, ... per trajectory in a row, 0 = padding
    loss_mask: Any = None  # float32; 1 on trained tokens (the loss weights: 0 = not trained)
    advantages: Any = None  # float32; the trajectory's advantage on each of its tokens (RL)
    rollout_logprobs: Any = None  # float32; the rollout engine's log-probs at sampling (RL)
    old_logprobs: Any = None  # float32; the trainer's, recomputed before the updates (RL)
    policy_versions: Any = None  # int32; the policy version that sampled each token, -1 = not sampled

    @classmethod
    def of(cls, batch: TokenBatch | Mapping[str, Any]) -> TokenBatch:
        """A TokenBatch from itself or from a mapping of field names to arrays."""
        if isinstance(batch, TokenBatch):
            return batch
        unknown = set(batch) - set(cls._fields)
        if unknown:
            raise ValueError(f"batch has unknown fields {sorted(unknown)}; TokenBatch has {cls._fields}")
        return cls(**batch)

    def only(self, fields: tuple[str, ...]) -> TokenBatch:
        """This batch with every field outside `fields` set to None."""
        return TokenBatch(**{f: (getattr(self, f) if f in fields else None) for f in self._fields})

    def present(self) -> dict[str, Any]:
        """The fields that hold arrays, by name."""
        return {f: v for f, v in zip(self._fields, self, strict=True) if v is not None}


assert TokenBatch._fields == tuple(FIELDS), "TokenBatch and FIELDS list the same arrays"

LOGPROB_FIELDS = ("input_ids", "positions", "segment_ids")
SFT_FIELDS = LOGPROB_FIELDS + ("loss_mask",)
DAPO_FIELDS = SFT_FIELDS + ("advantages", "rollout_logprobs", "old_logprobs")


def step_fields(kind: str, *, off_policy: bool = False) -> tuple[str, ...]:
    """The batch fields a jitted pass reads: "logprobs", "sft" or "dapo" (the rollout log-probs
    only with the off-policy correction)."""
    if kind == "logprobs":
        return LOGPROB_FIELDS
    if kind == "sft":
        return SFT_FIELDS
    return DAPO_FIELDS if off_policy else tuple(f for f in DAPO_FIELDS if f != "rollout_logprobs")


def batch_bytes_per_token(fields: tuple[str, ...]) -> int:
    """Bytes per token position of the batch a pass reads (for the memory planner)."""
    return sum(np.dtype(FIELDS[f][0]).itemsize for f in fields)


@dataclass(frozen=True)
class Sequence:
    """One trajectory's tokens and what the loss needs of it."""

    input_ids: np.ndarray  # int [L]
    loss_mask: np.ndarray  # float/bool [L]
    rollout_logprobs: np.ndarray | None = None  # float [L]; None -> zeros (SFT)
    advantage: float = 0.0
    policy_versions: np.ndarray | None = None  # int [L]; -1 where not sampled; None -> -1

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {n} tokens")
        if self.rollout_logprobs is not None and len(self.rollout_logprobs) != n:
            raise ValueError(f"rollout_logprobs has {len(self.rollout_logprobs)} entries for {n} tokens")


@dataclass(frozen=True)
class PackedBatch:
    """The packed TokenBatch (old_logprobs None) plus where each sequence went."""

    arrays: TokenBatch
    placement: list[tuple[int, int, int]]  # per input sequence: (row, start, length kept)
    truncated: int  # sequences cut to fit seq_len

    @property
    def num_rows(self) -> int:
        return int(self.arrays.input_ids.shape[0])

    def rows(self, start: int, stop: int) -> TokenBatch:
        return TokenBatch(**{k: v[start:stop] for k, v in self.arrays.present().items()})


ROW_BUCKET_RATIO = 1.05  # real-token fraction 0.92-0.94 on the shipped stages (docs/performance.md)


def bucket_rows(needed: int, multiple: int, ratio: float) -> int:
    """The smallest rung >= `needed` of the row ladder: `multiple`, then each rung the next multiple
    of `multiple` at least `ratio` x the last (ratio 1: every multiple). Each rung is one compiled
    shape; a stage hits the few rungs around its packed row count."""
    if multiple < 1 or ratio < 1:
        raise ValueError(f"row multiple must be >= 1 and ratio >= 1, got {multiple}, {ratio}")
    rows = multiple
    while rows < needed:
        rows = -(-max(math.ceil(rows * ratio - 1e-9), rows + 1) // multiple) * multiple
    return rows


def first_fit_decreasing(lengths: list[int], seq_len: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Rows of `seq_len` tokens for sequences of `lengths` (each <= seq_len), longest first, each
    into the first row it fits: per sequence (row, start), and each row's filled tokens."""
    row_fill: list[int] = []
    placement: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        row = next((r for r, used in enumerate(row_fill) if used + n <= seq_len), None)
        if row is None:
            row_fill.append(0)
            row = len(row_fill) - 1
        placement[i] = (row, row_fill[row])
        row_fill[row] += n
    return placement, row_fill


def pack_sequences(
    sequences: list[Sequence], seq_len: int, *, rows_multiple: int = 1, row_ratio: float = ROW_BUCKET_RATIO
) -> PackedBatch:
    """First-fit-decreasing packing into rows of `seq_len` tokens.

    A sequence longer than `seq_len` keeps its first `seq_len` tokens (counted in `truncated`).
    The row count is rounded up with empty rows to a rung of the `bucket_rows` ladder (ratio
    `row_ratio`, rungs multiples of `rows_multiple`), capped at one row per sequence, so that few
    distinct shapes reach the jitted train step.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    lengths = [min(len(s.input_ids), seq_len) for s in sequences]
    starts, row_fill = first_fit_decreasing(lengths, seq_len)
    placement = [(row, start, n) for (row, start), n in zip(starts, lengths, strict=True)]
    all_rows = -(-max(len(sequences), 1) // rows_multiple) * rows_multiple
    num_rows = min(bucket_rows(len(row_fill), rows_multiple, row_ratio), all_rows)
    shape = (num_rows, seq_len)
    arrays = {k: np.full(shape, fill, dtype) for k, (dtype, fill) in FIELDS.items() if k != "old_logprobs"}
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
        if seq.rollout_logprobs is not None:
            arrays["rollout_logprobs"][row, span] = np.asarray(seq.rollout_logprobs[:n], np.float32)
        arrays["advantages"][row, span] = float(seq.advantage)
        if seq.policy_versions is not None:
            arrays["policy_versions"][row, span] = np.asarray(seq.policy_versions[:n], np.int32)
    # Position 0 of a segment has no prefix: it is never a trained token.
    arrays["loss_mask"][arrays["positions"] == 0] = 0.0
    truncated = sum(1 for s, n in zip(sequences, lengths, strict=True) if len(s.input_ids) > n)
    return PackedBatch(arrays=TokenBatch(**arrays), placement=placement, truncated=truncated)


def pad_rows(batch: TokenBatch, num_rows: int) -> TokenBatch:
    """Append empty rows (segment 0, no loss) so every array has `num_rows` rows."""
    have = len(batch.input_ids)
    if have > num_rows:
        raise ValueError(f"cannot pad {have} rows down to {num_rows}")

    def pad(name: str, v: np.ndarray) -> np.ndarray:
        fill = np.full((num_rows - have, *v.shape[1:]), FIELDS[name][1], v.dtype)
        return np.concatenate([v, fill])

    return TokenBatch(**{k: pad(k, v) for k, v in batch.present().items()})


def split_rows(num_rows: int, num_steps: int) -> list[tuple[int, int]]:
    """Cut `num_rows` rows into `num_steps` contiguous, non-empty, near-equal [start, stop) spans."""
    num_steps = max(1, min(num_steps, num_rows))
    bounds = np.linspace(0, num_rows, num_steps + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def unpack_tokens(values_bt: np.ndarray, batch: PackedBatch, index: int) -> np.ndarray:
    """The [L] slice of a per-token [B, T] array that belongs to sequence `index`."""
    row, start, n = batch.placement[index]
    return values_bt[row, start : start + n]
