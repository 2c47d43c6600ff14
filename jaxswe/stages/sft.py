"""Supervised epochs over trajectories (warm start and RFT): shuffle, group `batch_size`
trajectories per optimizer step, pack each group into rows, one SFT update per group."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from jaxswe.config import SFTSection
from jaxswe.distributed import is_main
from jaxswe.packing import Sequence, pack_sequences, pad_rows
from jaxswe.run.metrics import MetricsLogger
from jaxswe.run.progress import Progress
from jaxswe.train.trainer import Trainer


def num_sft_steps(num_sequences: int, sft: SFTSection) -> int:
    """Optimizer steps for `sft.epochs` over the data: ceil(epochs x sequences / batch_size), capped
    by `sft.max_steps` (the paper's "50 steps" is `max_steps: 50`, about half an epoch of its
    6,548 trajectories at batch 64)."""
    steps = math.ceil(sft.epochs * num_sequences / sft.batch_size) if num_sequences else 0
    return min(steps, sft.max_steps) if sft.max_steps else steps


def run_sft(
    trainer: Trainer,
    sequences: list[Sequence],
    sft: SFTSection,
    metrics: MetricsLogger,
    *,
    seed: int,
    desc: str,
    start_step: int = 0,
    checkpoint: Callable[[int], None] | None = None,
) -> list[dict[str, float]]:
    """Train steps `start_step + 1 .. num_sft_steps`; log one metrics row per step; return the rows.

    The data order depends only on `seed`, so a run resumed at `start_step` (trainer restored from
    that step's checkpoint) trains on exactly the batches the killed run would have.
    `checkpoint(step)` is called every `sft.checkpoint_every` steps (not after the last one: the
    caller saves the final state with its summary).
    """
    steps = num_sft_steps(len(sequences), sft)
    rng = np.random.default_rng(seed)
    stream: list[int] = []
    rows = []
    rows_per_step = 0
    progress = Progress(desc, steps, unit="step", initial=start_step, enabled=is_main())
    for step in range(steps):
        while len(stream) < sft.batch_size:
            stream += rng.permutation(len(sequences)).tolist()
        chosen, stream = stream[: sft.batch_size], stream[sft.batch_size :]
        if step < start_step:  # replayed to reach the same data order, not trained
            continue
        batch = pack_sequences(
            [sequences[i] for i in chosen], sft.seq_len, rows_multiple=trainer.rows_multiple
        )
        # Pad to the most rows seen so far: few shapes reach the jitted step (rows are rungs of a
        # ladder), and a batch that packs into more rows than the first one just grows the shape.
        rows_per_step = max(rows_per_step, batch.num_rows)
        arrays = pad_rows(batch.arrays, rows_per_step)
        out = trainer.sft_update(arrays)
        out["tokens_trained"] = float(arrays.loss_mask.sum())
        metrics.log(step + 1, out)
        rows.append(out)
        progress.update(loss=float(out["loss"]))
        every = sft.checkpoint_every
        if checkpoint is not None and every and (step + 1) % every == 0 and step + 1 < steps:
            checkpoint(step + 1)
    progress.close()
    return rows
