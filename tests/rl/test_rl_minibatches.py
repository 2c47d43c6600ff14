"""How one RL iteration's trajectories become optimizer steps (`jaxswe.rl.train.minibatches`)."""

import numpy as np
import pytest

from jaxswe.config import RLSection
from jaxswe.packing import Sequence


def _trajectories():
    """16 long failures (advantage -1, 40 tokens) and 16 short successes (+1, 10 tokens); token
    values encode the trajectory index so each can be found again."""
    seqs = []
    for i in range(32):
        n, adv = (40, -1.0) if i < 16 else (10, 1.0)
        ids = np.full(n, 100 + i, np.int32)
        seqs.append(Sequence(input_ids=ids, loss_mask=np.ones(n, np.float32), advantage=adv))
    return seqs


def _found(steps):
    return [sorted({int(t) - 100 for t in a.input_ids[a.segment_ids > 0]}) for a in steps]


@pytest.mark.parametrize("rows_per_step", [None, 4])
def test_each_trajectory_once_in_random_mixed_steps(rows_per_step):
    from jaxswe.rl.train import minibatches

    rl = RLSection(trajectories_per_step=8, seq_len=64, rows_per_step=rows_per_step)
    steps, truncated = minibatches(_trajectories(), rl, 2, np.random.default_rng(0))
    assert truncated == 0
    found = _found(steps)
    assert sorted(i for f in found for i in f) == list(range(32))  # each trajectory exactly once
    for arrays in steps:
        rows = len(arrays.input_ids)
        assert rows == rows_per_step if rows_per_step else rows % 2 == 0
        assert set(arrays.present()) >= {"input_ids", "positions", "segment_ids", "loss_mask", "advantages"}
    if rows_per_step is None:
        assert len(steps) == 4  # 32 / trajectories_per_step
        # packing sorts by length; the shuffle happens first, so steps mix failures and successes
        signs = [set(np.sign(a.advantages[a.loss_mask > 0]).tolist()) for a in steps]
        assert all(s == {-1.0, 1.0} for s in signs), signs
    else:
        assert len(steps) >= 4  # a mini-batch of 8 needs up to 8 rows of 64: split over steps
    again, _ = minibatches(_trajectories(), rl, 2, np.random.default_rng(0))
    assert _found(again) == found  # seeded: a resumed iteration trains the same steps
    other, _ = minibatches(_trajectories(), rl, 2, np.random.default_rng(1))
    assert _found(other) != found
