"""Context-parallel attention (ring and all-gather, zigzag-balanced) equals dense attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sharding import make_context_attention, make_mesh, make_rules, reorder_for_context, restore_order
from sharding.context import zigzag_order
from sharding.errors import ShardingError
from sharding.flash import flash_attention

B, T, H, K, D = 2, 32, 4, 2, 8


def dense_attention(q, k, v, pos, seg):
    """float64 NumPy reference: causal by position, never across segments, segment 0 sees nothing."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    k, v = np.repeat(k, H // K, axis=2), np.repeat(v, H // K, axis=2)
    s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(D)
    m = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0) & (pos[:, :, None] >= pos[:, None, :])
    s = np.where(m[:, None], s, -np.inf)
    mx = np.max(np.where(m[:, None], s, -1e300), -1, keepdims=True)
    p = np.where(m[:, None], np.exp(s - mx), 0.0)
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
    return np.einsum("bhts,bshd->bthd", p, v)


def dense_jax(q, k, v, pos, seg):
    k, v = jnp.repeat(k, H // K, axis=2), jnp.repeat(v, H // K, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(D)
    m = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0) & (pos[:, :, None] >= pos[:, None, :])
    p = jax.nn.softmax(jnp.where(m[:, None], s, -1e30), -1) * m[:, None]
    return jnp.einsum("bhts,bshd->bthd", p, v)


def make_inputs(packed: bool):
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(B, T, K, D)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(B, T, K, D)), jnp.float32)
    if packed:  # row 0: two trajectories + padding; row 1: three trajectories
        seg = np.array([[1] * 11 + [2] * 15 + [0] * 6, [1] * 5 + [2] * 20 + [3] * 7])
        pos = np.stack(
            [
                np.concatenate([np.arange(11), np.arange(15), np.zeros(6, int)]),
                np.concatenate([np.arange(5), np.arange(20), np.arange(7)]),
            ]
        )
    else:
        seg = np.ones((B, T), int)
        pos = np.tile(np.arange(T), (B, 1))
    return q, k, v, pos.astype(np.int32), seg.astype(np.int32)


def test_zigzag_order_balances_and_round_trips():
    order = zigzag_order(16, 4)
    np.testing.assert_array_equal(order[:4], [0, 1, 14, 15])
    x = jnp.arange(2 * 16).reshape(2, 16)
    np.testing.assert_array_equal(restore_order(reorder_for_context(x, 4), 4), x)
    # Causal work (unmasked pairs) per device is equal under zigzag.
    work = [sum(int(t) + 1 for t in order[i * 4 : (i + 1) * 4]) for i in range(4)]
    assert len(set(work)) == 1
    with pytest.raises(ShardingError, match="divisible by 2 x context size"):
        zigzag_order(12, 4)


def test_flash_attention_matches_reference_with_lse():
    q, k, v, pos, seg = make_inputs(packed=True)
    kw = dict(q_positions=pos, kv_positions=pos, q_segment_ids=seg, kv_segment_ids=seg, block_q=8, block_kv=8)
    out, lse = jax.jit(lambda q, k, v: flash_attention(q, k, v, **kw))(q, k, v)
    np.testing.assert_allclose(out, dense_attention(q, k, v, pos, seg), atol=1e-5)
    eager, _ = flash_attention(q, k, v, **kw)  # unjitted path
    np.testing.assert_allclose(eager, out, atol=1e-6)
    assert lse.shape == (B, T, H) and bool(jnp.all(jnp.isfinite(lse)))
    assert float(jnp.abs(out[0, 26:]).max()) == 0.0  # padding rows are zero


CASES = [(kind, n, True) for kind in ("ring", "allgather") for n in (2, 4, 8)] + [
    ("ring", 4, False),
    ("allgather", 8, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("kind, n, packed", CASES)
def test_context_attention_matches_dense(kind, n, packed):
    mesh = make_mesh({"data": 8 // n, "context": n})
    rules = make_rules({"batch": "data"})
    attn = make_context_attention(mesh, rules, kind, block=4)
    q, k, v, pos, seg = make_inputs(packed)
    zq, zk, zv, zpos, zseg = (
        reorder_for_context(x, n) for x in (q, k, v, jnp.asarray(pos), jnp.asarray(seg))
    )

    def cp_loss(q, k, v):
        out = attn(q, k, v, q_positions=zpos, kv_positions=zpos, q_segment_ids=zseg, kv_segment_ids=zseg)
        return jnp.sum(jnp.sin(restore_order(out, n))), out

    def ref_loss(q, k, v):
        return jnp.sum(jnp.sin(dense_jax(q, k, v, pos, seg)))

    (_, out), grads = jax.jit(jax.value_and_grad(cp_loss, (0, 1, 2), has_aux=True))(zq, zk, zv)
    np.testing.assert_allclose(restore_order(out, n), dense_attention(q, k, v, pos, seg), atol=1e-5)
    ref_grads = jax.grad(ref_loss, (0, 1, 2))(q, k, v)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(restore_order(g, n), r, atol=1e-5)


def test_context_attention_with_tensor_axis_splits_heads():
    mesh = make_mesh({"context": 4, "tensor": 2})
    rules = make_rules()
    attn = make_context_attention(mesh, rules, "ring", block=4)
    q, k, v, pos, seg = make_inputs(packed=True)
    z = [reorder_for_context(jnp.asarray(x), 4) for x in (q, k, v, pos, seg)]
    out = jax.jit(attn)(
        z[0], z[1], z[2], q_positions=z[3], kv_positions=z[3], q_segment_ids=z[4], kv_segment_ids=z[4]
    )
    np.testing.assert_allclose(restore_order(out, 4), dense_attention(q, k, v, pos, seg), atol=1e-5)


def test_context_attention_rejects_bad_kind():
    with pytest.raises(ShardingError, match="ring"):
        make_context_attention(make_mesh({"context": 8}), make_rules(), "tree")
