import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxswe.packing import (
    ROW_BUCKET_RATIO,
    Sequence,
    bucket_rows,
    first_fit_decreasing,
    pack_sequences,
    pad_rows,
    split_rows,
    unpack_tokens,
)


def _seq(n, adv=0.0, start=1):
    ids = np.arange(start, start + n)
    mask = (np.arange(n) % 2).astype(np.float32)
    return Sequence(ids, mask, rollout_logprobs=-np.arange(n, dtype=np.float32) / 10, advantage=adv)


def test_segments_positions_and_alignment():
    seqs = [_seq(5, 1.0), _seq(3, -1.0, start=100), _seq(7, 0.5, start=200)]
    batch = pack_sequences(seqs, 10, row_ratio=1.0)
    a = batch.arrays._asdict()
    assert a["input_ids"].shape == (2, 10)
    for i, s in enumerate(seqs):
        row, start, n = batch.placement[i]
        np.testing.assert_array_equal(unpack_tokens(a["input_ids"], batch, i), s.input_ids)
        np.testing.assert_array_equal(a["positions"][row, start : start + n], np.arange(n))
        seg = a["segment_ids"][row, start : start + n]
        assert len(set(seg.tolist())) == 1 and seg[0] >= 1
        assert np.all(a["advantages"][row, start : start + n] == s.advantage)
        np.testing.assert_allclose(unpack_tokens(a["rollout_logprobs"], batch, i), s.rollout_logprobs)
    # padding is segment 0 and never trained on
    pad = a["segment_ids"] == 0
    assert np.all(a["loss_mask"][pad] == 0) and np.all(a["input_ids"][pad] == 0)
    assert np.all(a["loss_mask"][a["positions"] == 0] == 0)


def test_truncation_and_row_rounding():
    batch = pack_sequences([_seq(12), _seq(2)], 8, rows_multiple=4)
    assert batch.truncated == 1
    assert batch.num_rows == 4
    assert batch.placement[0][2] == 8


def test_bad_sequence_rejected():
    with pytest.raises(ValueError, match="loss_mask"):
        Sequence(np.arange(4), np.ones(3))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 16), min_size=1, max_size=12), st.integers(16, 40))
def test_packing_keeps_every_token_once(lengths, seq_len):
    seqs = [_seq(n, start=1000 * i) for i, n in enumerate(lengths)]
    batch = pack_sequences(seqs, seq_len)
    a = batch.arrays._asdict()
    assert int((a["segment_ids"] > 0).sum()) == sum(lengths)
    for row in range(batch.num_rows):
        segs = a["segment_ids"][row]
        used = segs[segs > 0]
        # segments are contiguous and numbered 1..n in order
        assert np.all(np.diff(used) >= 0)
        if used.size:
            assert used[0] == 1 and used[-1] == len(set(used.tolist()))
    for i, s in enumerate(seqs):
        np.testing.assert_array_equal(unpack_tokens(a["input_ids"], batch, i), s.input_ids)


def test_split_rows():
    assert split_rows(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert split_rows(2, 4) == [(0, 1), (1, 2)]


def test_pad_rows():
    batch = pack_sequences([_seq(5)], 8, row_ratio=1.0)
    padded = pad_rows(batch.arrays, 3)
    assert padded.input_ids.shape == (3, 8) and padded.old_logprobs is None
    assert not padded.segment_ids[1:].any() and not padded.loss_mask[1:].any()
    with pytest.raises(ValueError):
        pad_rows(padded, 2)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 600), st.sampled_from([1, 2, 6, 16, 32]), st.sampled_from([1.0, 1.05, 1.1, 1.25, 2.0]))
def test_bucket_rows_is_the_smallest_rung_that_holds(needed, multiple, ratio):
    rungs = sorted({bucket_rows(k, multiple, ratio) for k in range(0, 601)})
    rows = bucket_rows(needed, multiple, ratio)
    assert rows >= needed and rows % multiple == 0 and rows in rungs
    assert all(r < needed for r in rungs if r < rows)
    # ratio 1: every multiple; ratio > 1: about log(600 / multiple) / log(ratio) rungs
    if ratio == 1.0:
        assert rows == max(-(-needed // multiple) * multiple, multiple)
    else:
        bound = 1 / (ratio - 1) + math.log(600 / multiple) / math.log(ratio) + 2
        assert len(rungs) <= bound


def test_power_of_two_multiples_are_the_ratio_two_ladder():
    assert [bucket_rows(n, 16, 2.0) for n in (1, 17, 33, 129, 256)] == [16, 32, 64, 256, 256]
    with pytest.raises(ValueError):
        bucket_rows(4, 2, 0.9)


def test_rows_capped_at_one_row_per_sequence():
    # 9 full sequences need 9 rows; the ratio-2 ladder from 4 says 16, one row each (to 4) says 12
    batch = pack_sequences([_seq(8) for _ in range(9)], 8, rows_multiple=4, row_ratio=2.0)
    assert batch.num_rows == 12
    assert pack_sequences([_seq(8) for _ in range(5)], 8, rows_multiple=1, row_ratio=2.0).num_rows == 5


@pytest.mark.parametrize(
    "n, seq_len, multiple, draw",
    [
        (256, 131072, 16, lambda rng, n: rng.integers(8192, 131073, n)),  # 72B stage 2
        (128, 65536, 2, lambda rng, n: np.minimum(rng.lognormal(np.log(20_000), 0.5, n), 65536).astype(int)),
    ],
    ids=["72b-stage2-uniform", "7b-stage1-lognormal"],
)
def test_real_token_fraction_at_least_0_9(n, seq_len, multiple, draw):
    rng = np.random.default_rng(0)
    real = rows = 0
    shapes = set()
    for _ in range(40):
        lengths = draw(rng, n).tolist()
        packed = len(first_fit_decreasing(lengths, seq_len)[1])
        step_rows = bucket_rows(packed, multiple, ROW_BUCKET_RATIO)
        real, rows = real + sum(lengths), rows + step_rows
        shapes.add(step_rows)
    assert real / (rows * seq_len) >= 0.9
    assert len(shapes) <= 6
