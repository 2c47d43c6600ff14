"""Token-budget batching: with optimizer.micro_batch_rows a step's row count (and micro-batch
count) follows the trajectories' total length. 8 short + 1 long trajectory pack into 2 rows
instead of one row each, with the same loss (the normalizer is the global trained-token count)."""

import jax
import numpy as np
import pytest

from jaxswe.config import OptimizerSection
from jaxswe.model.config import get_preset
from jaxswe.model.params import init_params
from jaxswe.packing import Sequence, TokenBatch, pack_sequences, pad_rows
from jaxswe.train.trainer import Trainer

SEQ_LEN = 256
CONFIG = get_preset("tiny", attention="dense")


def _sequences() -> list[Sequence]:
    rng = np.random.default_rng(0)
    out = []
    for i, n in enumerate([20] * 8 + [200]):
        ids = rng.integers(0, CONFIG.vocab_size, n).astype(np.int32)
        mask = (np.arange(n) >= n // 2).astype(np.float32)  # the second half is "generated"
        out.append(Sequence(ids, mask, -rng.random(n).astype(np.float32), advantage=(-1.0) ** i))
    return out


def _one_row_each(seqs: list[Sequence]) -> TokenBatch:
    rows = [pack_sequences([s], SEQ_LEN).arrays.present() for s in seqs]
    stacked = {k: np.concatenate([r[k][:1] for r in rows]) for k in rows[0]}
    return pad_rows(TokenBatch(**stacked), 16)


def _step(batch: TokenBatch) -> dict[str, float]:
    opt = OptimizerSection(lr=1e-3, weight_decay=0.0, micro_batch_rows=1)
    trainer = Trainer(CONFIG, init_params(CONFIG, jax.random.key(0)), opt)
    batch = batch._replace(old_logprobs=trainer.logprobs(batch)[0])
    return trainer.dapo_update(batch)


@pytest.mark.slow
def test_short_trajectories_pack_into_few_rows_with_the_same_loss():
    seqs = _sequences()
    packed = pack_sequences(seqs, SEQ_LEN, rows_multiple=1).arrays
    unpacked = _one_row_each(seqs)
    assert packed.input_ids.shape == (2, SEQ_LEN) and unpacked.input_ids.shape == (16, SEQ_LEN)
    assert packed.loss_mask.sum() == unpacked.loss_mask.sum()
    a, b = _step(packed), _step(unpacked)
    assert a["tokens"] == b["tokens"]
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
