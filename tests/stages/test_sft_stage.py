"""`run_sft` (warm start and RFT): batches that pack into different row counts all train."""

import jax
import numpy as np
import pytest

from jaxswe.config import OptimizerSection, SFTSection
from jaxswe.model.config import get_preset
from jaxswe.model.params import init_params
from jaxswe.packing import Sequence
from jaxswe.run.metrics import MetricsLogger, read_rows
from jaxswe.stages.sft import num_sft_steps, run_sft
from jaxswe.train.trainer import Trainer


def _seq(n: int, rng) -> Sequence:
    return Sequence(input_ids=rng.integers(1, 64, n).astype(np.int32), loss_mask=np.ones(n, np.float32))


@pytest.mark.slow
def test_run_sft_grows_rows_when_a_later_batch_packs_into_more(tmp_path):
    rng = np.random.default_rng(0)
    # Two per step: the short pair fits one 32-token row, any other pair needs two. With seed 1
    # the first epoch's order is 0, 1, 2, 3: a one-row batch comes first, then a two-row one.
    assert np.random.default_rng(1).permutation(4).tolist() == [0, 1, 2, 3]
    sequences = [_seq(10, rng), _seq(12, rng), _seq(30, rng), _seq(31, rng)]
    cfg = get_preset("tiny", vocab_size=64, attention="dense")
    trainer = Trainer(cfg, init_params(cfg, jax.random.key(0)), OptimizerSection(lr=1e-3, weight_decay=0.0))
    sft = SFTSection(epochs=3, batch_size=2, seq_len=32)
    rows = run_sft(trainer, sequences, sft, MetricsLogger(tmp_path), seed=1, desc="sft")
    assert len(rows) == num_sft_steps(len(sequences), sft) == 6
    assert all(np.isfinite(r["loss"]) for r in rows)
    logged = read_rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in logged] == list(range(1, 7))
    # every trained token was counted, whatever the batch's row count (position 0 never trains)
    assert logged[0]["tokens_trained"] == 10 + 12 - 2
    assert logged[1]["tokens_trained"] == 30 + 31 - 2
