import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxswe.data.packing import Sequence, pack_sequences, pad_rows, split_rows, unpack_tokens


def _seq(n, adv=0.0, start=1):
    ids = np.arange(start, start + n)
    mask = (np.arange(n) % 2).astype(np.float32)
    return Sequence(ids, mask, rollout_logprobs=-np.arange(n, dtype=np.float32) / 10, advantage=adv)


def test_segments_positions_and_alignment():
    seqs = [_seq(5, 1.0), _seq(3, -1.0, start=100), _seq(7, 0.5, start=200)]
    batch = pack_sequences(seqs, 10, power_of_two_rows=False)
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
    batch = pack_sequences([_seq(5)], 8, power_of_two_rows=False)
    padded = pad_rows(batch.arrays, 3)
    assert padded.input_ids.shape == (3, 8) and padded.old_logprobs is None
    assert not padded.segment_ids[1:].any() and not padded.loss_mask[1:].any()
    with pytest.raises(ValueError):
        pad_rows(padded, 2)
