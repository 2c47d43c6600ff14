"""Causal, segment-aware grouped-query attention: blockwise (memory-linear), dense reference, cuDNN.

Every attention function has the signature
`fn(q_bthd, k_bshd, v_bshd, *, q_positions, kv_positions, q_segment_ids, kv_segment_ids) -> out_bthd`
with `H` query heads and `Hkv` key/value heads (`H % Hkv == 0`). Query `t` sees key `s` iff both
carry the same segment id, that id is not 0 (0 marks padding), and `kv_positions[s] <= q_positions[t]`.
Segment ids None means one segment. A query that sees no key gets a zero output. K/V are never
repeated per query head: queries are viewed as [B, T, Hkv, G, D].
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from jaxswe.model.config import ModelConfigError

AttentionFn = Callable[..., jnp.ndarray]
_NEG = -1e30


def _visible(q_pos_bt, kv_pos_bs, q_seg_bt, kv_seg_bs) -> jnp.ndarray:
    """Boolean [B, T, S]: which keys each query may attend to."""
    same = q_seg_bt[:, :, None] == kv_seg_bs[:, None, :]
    causal = kv_pos_bs[:, None, :] <= q_pos_bt[:, :, None]
    return same & causal & (kv_seg_bs[:, None, :] != 0)


def _check(q, k, v, q_positions, kv_positions, q_segment_ids, kv_segment_ids):
    chex.assert_rank([q, k, v], 4)
    chex.assert_equal_shape([k, v])
    b, t, h, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    chex.assert_shape(k, (b, s, hkv, d))
    if h % hkv:
        raise ValueError(f"attention: {h} query heads not a multiple of {hkv} kv heads")
    chex.assert_shape(q_positions, (b, t))
    chex.assert_shape(kv_positions, (b, s))
    q_seg = jnp.ones((b, t), jnp.int32) if q_segment_ids is None else q_segment_ids
    kv_seg = jnp.ones((b, s), jnp.int32) if kv_segment_ids is None else kv_segment_ids
    chex.assert_shape(q_seg, (b, t))
    chex.assert_shape(kv_seg, (b, s))
    return q.reshape(b, t, hkv, h // hkv, d), q_seg, kv_seg


def dense_attention(q_bthd, k_bshd, v_bshd, *, q_positions, kv_positions, q_segment_ids=None,
                    kv_segment_ids=None) -> jnp.ndarray:  # fmt: skip
    """Reference attention materializing [B, Hkv, G, T, S] float32 scores."""
    q5, q_seg, kv_seg = _check(
        q_bthd, k_bshd, v_bshd, q_positions, kv_positions, q_segment_ids, kv_segment_ids
    )
    scale = q_bthd.shape[-1] ** -0.5
    mask = _visible(q_positions, kv_positions, q_seg, kv_seg)[:, None, None]
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q5, k_bshd, preferred_element_type=jnp.float32) * scale
    s = jnp.where(mask, s, _NEG)
    p = jnp.where(mask, jnp.exp(s - s.max(-1, keepdims=True)), 0.0)
    p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-30)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", p.astype(v_bshd.dtype), v_bshd, preferred_element_type=jnp.float32)
    return out.reshape(q_bthd.shape).astype(q_bthd.dtype)


def _pad_to(x, length, axis, value=0):
    extra = length - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _blocks(x, block):
    """[B, N*block, ...] -> [N, B, block, ...] (block index first, for scan/map)."""
    b, n = x.shape[0], x.shape[1] // block
    return jnp.moveaxis(x.reshape(b, n, block, *x.shape[2:]), 1, 0)


def _unblock(x):
    """[N, B, block, ...] -> [B, N*block, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _scores(q_blk, k_blk, q_pos, kv_pos, q_seg, kv_seg, scale):
    mask = _visible(q_pos, kv_pos, q_seg, kv_seg)[:, None, None]  # [B, 1, 1, bq, bk]
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q_blk, k_blk, preferred_element_type=jnp.float32) * scale
    return s, mask


def _flash_forward(q5, k, v, q_pos, kv_pos, q_seg, kv_seg, bq, bk):
    """Online softmax. q5 [B, T, Hkv, G, D] with T % bq == 0, S % bk == 0. Returns (out f32, lse)."""
    scale = q5.shape[-1] ** -0.5
    kv_xs = (_blocks(k, bk), _blocks(v, bk), _blocks(kv_pos, bk), _blocks(kv_seg, bk))

    def one_q_block(q_xs):
        q_blk, qp, qs = q_xs
        b, _, hkv, g, d = q_blk.shape
        init = (
            jnp.zeros((b, bq, hkv, g, d), jnp.float32),
            jnp.full((b, hkv, g, bq), _NEG, jnp.float32),
            jnp.zeros((b, hkv, g, bq), jnp.float32),
        )

        def kv_step(carry, xs):
            k_blk, v_blk, kp, ks = xs
            s, mask = _scores(q_blk, k_blk, qp, kp, qs, ks, scale)

            def update(carry):
                acc, m, l = carry
                m_new = jnp.maximum(m, jnp.where(mask, s, _NEG).max(-1))
                p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
                corr = jnp.exp(m - m_new)
                pv = jnp.einsum("bhgqk,bkhd->bqhgd", p.astype(v_blk.dtype), v_blk,
                                preferred_element_type=jnp.float32)  # fmt: skip
                acc = acc * jnp.moveaxis(corr, -1, 1)[..., None] + pv
                return acc, m_new, l * corr + p.sum(-1)

            return jax.lax.cond(mask.any(), update, lambda c: c, carry), None

        (acc, m, l), _ = jax.lax.scan(kv_step, init, kv_xs)
        safe_l = jnp.where(l > 0, l, 1.0)
        out = acc / jnp.moveaxis(safe_l, -1, 1)[..., None]
        lse = jnp.where(l > 0, m + jnp.log(safe_l), 0.0)
        return out, lse

    out_blocks, lse_blocks = jax.lax.map(
        one_q_block, (_blocks(q5, bq), _blocks(q_pos, bq), _blocks(q_seg, bq))
    )
    return _unblock(out_blocks), lse_blocks


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _flash(q5, k, v, q_pos, kv_pos, q_seg, kv_seg, bq, bk):
    out, _ = _flash_forward(q5, k, v, q_pos, kv_pos, q_seg, kv_seg, bq, bk)
    return out.astype(q5.dtype)


def _flash_fwd(q5, k, v, q_pos, kv_pos, q_seg, kv_seg, bq, bk):
    # Under differentiation this forward is inlined into the caller's jaxpr. When the caller is a
    # `lax.scan` (the model's layer scan, with or without remat), the scan's partial evaluation
    # hoists loop-invariant work out of the loop: everything here that depends only on positions
    # and segment ids (block masks, their score-shaped broadcasts) would be precomputed for every
    # (q block, kv block) pair and kept alive, O(T * S) memory. Tying positions and segment ids to
    # q/k/v through a barrier makes them loop-variant, so the masks stay per block.
    q5, k, v, q_pos, kv_pos, q_seg, kv_seg = jax.lax.optimization_barrier(
        (q5, k, v, q_pos, kv_pos, q_seg, kv_seg)
    )
    out, lse_blocks = _flash_forward(q5, k, v, q_pos, kv_pos, q_seg, kv_seg, bq, bk)
    out = out.astype(q5.dtype)
    return out, (q5, k, v, q_pos, kv_pos, q_seg, kv_seg, out, lse_blocks)


def _flash_bwd(bq, bk, res, dout):
    q5, k, v, q_pos, kv_pos, q_seg, kv_seg, out, lse_blocks = res
    scale = q5.shape[-1] ** -0.5
    delta = jnp.einsum("bqhgd,bqhgd->bhgq", dout.astype(jnp.float32), out.astype(jnp.float32))
    q_xs = (_blocks(q5, bq), _blocks(dout, bq), _blocks(q_pos, bq), _blocks(q_seg, bq), lse_blocks,
            jnp.moveaxis(delta.reshape(*delta.shape[:3], -1, bq), 3, 0))  # fmt: skip
    kv_xs = (_blocks(k, bk), _blocks(v, bk), _blocks(kv_pos, bk), _blocks(kv_seg, bk))

    def probs(q_blk, k_blk, qp, kp, qs, ks, lse_blk):
        s, mask = _scores(q_blk, k_blk, qp, kp, qs, ks, scale)
        return jnp.where(mask, jnp.exp(s - lse_blk[..., None]), 0.0), mask

    def grad_ds(p, do_blk, v_blk, delta_blk):
        dp = jnp.einsum("bqhgd,bkhd->bhgqk", do_blk, v_blk, preferred_element_type=jnp.float32)
        return p * (dp - delta_blk[..., None])

    def dq_block(qx):
        q_blk, do_blk, qp, qs, lse_blk, delta_blk = qx

        def step(dq, kx):
            k_blk, v_blk, kp, ks = kx
            p, mask = probs(q_blk, k_blk, qp, kp, qs, ks, lse_blk)

            def add(dq):
                ds = grad_ds(p, do_blk, v_blk, delta_blk)
                return dq + jnp.einsum("bhgqk,bkhd->bqhgd", ds, k_blk.astype(jnp.float32)) * scale

            return jax.lax.cond(mask.any(), add, lambda d: d, dq), None

        dq, _ = jax.lax.scan(step, jnp.zeros(q_blk.shape, jnp.float32), kv_xs)
        return dq

    def dkv_block(kx):
        k_blk, v_blk, kp, ks = kx

        def step(carry, qx):
            q_blk, do_blk, qp, qs, lse_blk, delta_blk = qx
            p, mask = probs(q_blk, k_blk, qp, kp, qs, ks, lse_blk)

            def add(carry):
                dk, dv = carry
                dv = dv + jnp.einsum("bhgqk,bqhgd->bkhd", p, do_blk.astype(jnp.float32))
                ds = grad_ds(p, do_blk, v_blk, delta_blk)
                return dk + jnp.einsum("bhgqk,bqhgd->bkhd", ds, q_blk.astype(jnp.float32)) * scale, dv

            return jax.lax.cond(mask.any(), add, lambda c: c, carry), None

        zeros = jnp.zeros(k_blk.shape, jnp.float32)
        (dk, dv), _ = jax.lax.scan(step, (zeros, zeros), q_xs)
        return dk, dv

    dq = _unblock(jax.lax.map(dq_block, q_xs))
    dk_blocks, dv_blocks = jax.lax.map(dkv_block, kv_xs)
    return (dq.astype(q5.dtype), _unblock(dk_blocks).astype(k.dtype), _unblock(dv_blocks).astype(v.dtype),
            None, None, None, None)  # fmt: skip


_flash.defvjp(_flash_fwd, _flash_bwd)


def blockwise_attention(q_bthd, k_bshd, v_bshd, *, q_positions, kv_positions, q_segment_ids=None,
                        kv_segment_ids=None, q_block=512, kv_block=512) -> jnp.ndarray:  # fmt: skip
    """Flash-style attention: online softmax over K/V blocks; memory O(T) forward and backward.

    The backward pass (custom VJP) recomputes block probabilities from the saved log-sum-exp, so
    no [T, S] array is kept. Blocks that no query of a block may see are skipped.
    """
    q5, q_seg, kv_seg = _check(
        q_bthd, k_bshd, v_bshd, q_positions, kv_positions, q_segment_ids, kv_segment_ids
    )
    t, s = q_bthd.shape[1], k_bshd.shape[1]
    bq, bk = min(q_block, t), min(kv_block, s)
    tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
    out = _flash(
        _pad_to(q5, tp, 1), _pad_to(k_bshd, sp, 1), _pad_to(v_bshd, sp, 1),
        _pad_to(q_positions.astype(jnp.int32), tp, 1), _pad_to(kv_positions.astype(jnp.int32), sp, 1),
        _pad_to(q_seg.astype(jnp.int32), tp, 1), _pad_to(kv_seg.astype(jnp.int32), sp, 1), bq, bk,
    )  # fmt: skip
    return out[:, :t].reshape(q_bthd.shape)


def cudnn_attention(q_bthd, k_bshd, v_bshd, *, q_positions, kv_positions, q_segment_ids=None,
                    kv_segment_ids=None) -> jnp.ndarray:  # fmt: skip
    """cuDNN fused attention (GPU only): causal by index, one segment per row, no packing.

    Packed or padded rows (segment ids given) are refused rather than silently attending across
    segments; use blockwise attention for them.
    """
    del q_positions, kv_positions
    if q_segment_ids is not None or kv_segment_ids is not None:
        raise ModelConfigError(
            "attention 'cudnn' does not support segment ids (packed rows); use 'blockwise'"
        )
    if q_bthd.shape[1] != k_bshd.shape[1]:
        raise ModelConfigError("attention 'cudnn' needs as many queries as keys; use 'blockwise'")
    return jax.nn.dot_product_attention(q_bthd, k_bshd, v_bshd, is_causal=True, implementation="cudnn")


def attention_from_config(kind: str, block: int) -> AttentionFn:
    """The attention function a config's `attention` and `attention_block` name."""
    if kind == "dense":
        return dense_attention
    if kind == "cudnn":
        return cudnn_attention
    return functools.partial(blockwise_attention, q_block=block, kv_block=block)
