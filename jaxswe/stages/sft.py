"""Supervised epochs over trajectories (warm start and RFT): shuffle, group `batch_size`
trajectories per optimizer step, pack each group into rows, one SFT update per group."""

from __future__ import annotations

import math

import numpy as np
from tqdm import tqdm

from jaxswe.config import SFTSection
from jaxswe.data.packing import Sequence, pack_sequences, pad_rows
from jaxswe.run.metrics import MetricsLogger
from jaxswe.stages.trainer import Trainer


def num_sft_steps(num_sequences: int, sft: SFTSection) -> int:
    """Optimizer steps for `sft.epochs` over the data (capped by `sft.max_steps`)."""
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
) -> list[dict[str, float]]:
    """Train; log one metrics row per step; return the rows."""
    steps = num_sft_steps(len(sequences), sft)
    rng = np.random.default_rng(seed)
    stream: list[int] = []
    rows = []
    rows_per_step = 0
    for step in tqdm(range(steps), desc=desc):
        while len(stream) < sft.batch_size:
            stream += rng.permutation(len(sequences)).tolist()
        chosen, stream = stream[: sft.batch_size], stream[sft.batch_size :]
        batch = pack_sequences(
            [sequences[i] for i in chosen], sft.seq_len, rows_multiple=trainer.rows_multiple
        )
        # Pad to the most rows seen so far: few shapes reach the jitted step (rows are powers of
        # two), and a batch that packs into more rows than the first one just grows the shape.
        rows_per_step = max(rows_per_step, batch.num_rows)
        arrays = pad_rows(batch.arrays, rows_per_step)
        out = trainer.sft_update(arrays)
        out["tokens_trained"] = float(arrays["loss_mask"].sum())
        metrics.log(step + 1, out)
        rows.append(out)
    return rows
