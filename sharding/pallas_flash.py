"""Fused flash attention for packed, causal, grouped-query attention: Pallas kernels (Triton lowering).

Same contract as `sharding.flash.flash_attention` (the blockwise reference): query t sees key s iff
they carry the same nonzero segment id and kv_position[s] <= q_position[t]; it returns
(out [B, T, H, D] in q's dtype, lse [B, T, H] float32), rows that see no key give out 0 and lse
NEG, and the lse output is differentiable (ring attention merges partial results with it).

Three kernels, each one program per (head, batch row, block):
- forward, grid (H, B, T/bq): online softmax over the key blocks this query block can see;
- dq, grid (H, B, T/bq): recomputes each block's probabilities from the saved lse;
- dk/dv, grid (Hkv, B, S/bk): loops over the G query heads of its group and the query blocks
  that can see it, so GQA needs no atomics and no per-head K/V copies.
Which key blocks a query block can see (and the reverse) is computed outside the kernels from
per-block summaries of positions and segments (`_visible_blocks`); each kernel loops only over
the [first, last] visible range, and masks inside it. Sequences are padded to a multiple of the
blocks (segment 0: invisible), head_dim to a power of two >= 16 (zeros leave scores unchanged).

On NVIDIA GPUs the kernels lower through Pallas's Triton backend; elsewhere `interpret=True` runs
the same kernel bodies as plain JAX (slow; for tests).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

NEG = -1e30  # finite "minus infinity" shared with sharding.flash: fully masked rows stay NaN-free


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Tile sizes (powers of two, >= 16) and Triton launch settings of the three kernels.
    Untuned defaults (no GPU measured yet): 8 warps hold the forward's 128 x head_dim float32
    accumulator for head_dim 128 (every Qwen2.5 size but 0.5B); bench/gpu/check.py's `tiles` rows
    compare others."""

    fwd_q: int = 128
    fwd_kv: int = 64
    bwd_q: int = 64
    bwd_kv: int = 64
    fwd_warps: int = 8
    bwd_warps: int = 4
    stages: int = 2

    def __post_init__(self) -> None:
        for name in ("fwd_q", "fwd_kv", "bwd_q", "bwd_kv"):
            b = getattr(self, name)
            if b < 16 or b & (b - 1):
                raise ValueError(f"pallas flash block {name}={b} must be a power of two >= 16")

    @property
    def multiple(self) -> int:
        """Sequences are padded to a multiple of this (the largest block)."""
        return max(self.fwd_q, self.fwd_kv, self.bwd_q, self.bwd_kv)


def _pow2_at_least(n: int, floor: int = 16) -> int:
    p = floor
    while p < n:
        p *= 2
    return p


def pad_axis(x, length, axis):
    """Zero-pad `axis` of x to `length` (segment 0 for ids: padding tokens are invisible)."""
    extra = length - x.shape[axis]
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def _block_summary(pos_bt, seg_bt, block):
    """Per block of `block` tokens: (min pos, max pos, min nonzero seg, max seg), each [B, N]."""
    b, t = pos_bt.shape
    pos = pos_bt.reshape(b, t // block, block)
    seg = seg_bt.reshape(b, t // block, block)
    live = seg != 0
    big = jnp.iinfo(jnp.int32).max
    return (
        jnp.where(live, pos, big).min(-1),
        jnp.where(live, pos, -big).max(-1),
        jnp.where(live, seg, big).min(-1),
        jnp.where(live, seg, -big).max(-1),
    )


def _visible_blocks(qpos, qseg, kpos, kseg, bq, bk):
    """Bool [B, T/bq, S/bk]: may some query of block i see some key of block j (conservative)."""
    _, qpos_max, qseg_min, qseg_max = _block_summary(qpos, qseg, bq)
    kpos_min, _, kseg_min, kseg_max = _block_summary(kpos, kseg, bk)
    overlap = (jnp.maximum(qseg_min[:, :, None], kseg_min[:, None, :])
               <= jnp.minimum(qseg_max[:, :, None], kseg_max[:, None, :]))  # fmt: skip
    return overlap & (kpos_min[:, None, :] <= qpos_max[:, :, None])


def _range(visible_bnm):
    """First visible index and one past the last along the last axis ([B, N] int32 each; lo=hi if none)."""
    m = visible_bnm.shape[-1]
    idx = jnp.arange(m, dtype=jnp.int32)
    any_ = visible_bnm.any(-1)
    lo = jnp.where(visible_bnm, idx, m).min(-1)
    hi = jnp.where(visible_bnm, idx + 1, 0).max(-1)
    return jnp.where(any_, lo, 0).astype(jnp.int32), jnp.where(any_, hi, 0).astype(jnp.int32)


def _mask(qpos, qseg, kpos, kseg):
    same = (qseg[:, None] == kseg[None, :]) & (qseg[:, None] != 0)
    return same & (kpos[None, :] <= qpos[:, None])


def _fwd_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, qpos_ref, qseg_ref, kpos_ref, kseg_ref,
                o_ref, lse_ref, *, scale, bk):  # fmt: skip
    q = q_ref[...]
    qpos, qseg = qpos_ref[...], qseg_ref[...]
    bq, d = q.shape

    def body(j, carry):
        m, l, acc = carry
        sl = pl.ds(j * bk, bk)
        k, v = k_ref[sl, :], v_ref[sl, :]
        mask = _mask(qpos, qseg, kpos_ref[sl], kseg_ref[sl])
        s = jnp.where(mask, pltriton.dot(q, k, trans_b=True) * scale, NEG)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
        corr = jnp.exp(m - m_new)
        acc = acc * corr[:, None] + pltriton.dot(p.astype(v.dtype), v)
        return m_new, l * corr + p.sum(-1), acc

    init = (jnp.full((bq,), NEG, jnp.float32), jnp.zeros((bq,), jnp.float32), jnp.zeros((bq, d), jnp.float32))
    m, l, acc = jax.lax.fori_loop(lo_ref[0], hi_ref[0], body, init)
    seen = l > 0
    safe_l = jnp.where(seen, l, 1.0)
    o_ref[...] = (acc / safe_l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, m + jnp.log(safe_l), NEG)


def _dq_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qpos_ref, qseg_ref,
               kpos_ref, kseg_ref, dq_ref, *, scale, bk):  # fmt: skip
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    qpos, qseg = qpos_ref[...], qseg_ref[...]

    def body(j, dq):
        sl = pl.ds(j * bk, bk)
        k, v = k_ref[sl, :], v_ref[sl, :]
        mask = _mask(qpos, qseg, kpos_ref[sl], kseg_ref[sl])
        p = jnp.where(mask, jnp.exp(pltriton.dot(q, k, trans_b=True) * scale - lse[:, None]), 0.0)
        ds = p * (pltriton.dot(do, v, trans_b=True) - delta[:, None])
        return dq + pltriton.dot(ds.astype(k.dtype), k)

    dq = jax.lax.fori_loop(lo_ref[0], hi_ref[0], body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qpos_ref, qseg_ref,
                kpos_ref, kseg_ref, dk_ref, dv_ref, *, scale, bq, groups):  # fmt: skip
    k, v = k_ref[...], v_ref[...]
    kpos, kseg = kpos_ref[...], kseg_ref[...]
    lo, hi = lo_ref[0], hi_ref[0]

    def head(g, carry):
        def body(i, carry):
            dk, dv = carry
            sl = pl.ds(i * bq, bq)
            q, do = q_ref[sl, g, :], do_ref[sl, g, :]
            lse, delta = lse_ref[g, sl], delta_ref[g, sl]
            mask = _mask(qpos_ref[sl], qseg_ref[sl], kpos, kseg)
            p = jnp.where(mask, jnp.exp(pltriton.dot(q, k, trans_b=True) * scale - lse[:, None]), 0.0)
            dv = dv + pltriton.dot(p.astype(do.dtype), do, trans_a=True)
            ds = p * (pltriton.dot(do, v, trans_b=True) - delta[:, None])
            return dk + pltriton.dot(ds.astype(q.dtype), q, trans_a=True), dv

        return jax.lax.fori_loop(lo, hi, body, carry)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(0, groups, head, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _params(warps, stages):
    return pltriton.CompilerParams(num_warps=warps, num_stages=stages)


def _query_block_specs(nq, s, bq, d, g):
    """BlockSpecs for a grid (head, row, query block) that runs the last query block (the one with
    the most causal work) first, every head of it together: late light blocks fill the tail."""
    at = lambda f: lambda hh, bb, i: f(hh, bb, nq - 1 - i)
    return {
        "table": pl.BlockSpec((None, 1), at(lambda hh, bb, i: (bb, i))),
        "q": pl.BlockSpec((None, bq, None, d), at(lambda hh, bb, i: (bb, i, hh, 0))),
        "kv": pl.BlockSpec((None, s, None, d), at(lambda hh, bb, i: (bb, 0, hh // g, 0))),
        "rows": pl.BlockSpec((None, None, bq), at(lambda hh, bb, i: (bb, hh, i))),
        "tokens": pl.BlockSpec((None, bq), at(lambda hh, bb, i: (bb, i))),
        "kv_tokens": pl.BlockSpec((None, s), at(lambda hh, bb, i: (bb, 0))),
    }


def _forward(q, k, v, qpos, kpos, qseg, kseg, scale, blocks, interpret):
    b, t, h, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    g, bq, bk = h // kvh, blocks.fwd_q, blocks.fwd_kv
    lo, hi = _range(_visible_blocks(qpos, qseg, kpos, kseg, bq, bk))
    sp = _query_block_specs(t // bq, s, bq, d, g)
    out, lse = pl.pallas_call(
        functools.partial(_fwd_kernel, scale=scale, bk=bk),
        out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, t), jnp.float32)),
        grid=(h, b, t // bq),
        in_specs=[
            sp["table"],
            sp["table"],
            sp["q"],
            sp["kv"],
            sp["kv"],
            sp["tokens"],
            sp["tokens"],
            sp["kv_tokens"],
            sp["kv_tokens"],
        ],
        out_specs=(sp["q"], sp["rows"]),
        compiler_params=_params(blocks.fwd_warps, blocks.stages),
        interpret=interpret,
        name="jaxswe_flash_fwd",
    )(lo, hi, q, k, v, qpos, qseg, kpos, kseg)
    return out, lse  # lse [B, H, T]


def _backward(q, k, v, qpos, kpos, qseg, kseg, out, lse_bht, dout, dlse_bht, scale, blocks, interpret):
    b, t, h, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    g, bq, bk = h // kvh, blocks.bwd_q, blocks.bwd_kv
    # d lse / d score = p, so an lse cotangent enters like a shift of the row term delta.
    delta = jnp.einsum("bthd,bthd->bht", dout.astype(jnp.float32), out.astype(jnp.float32)) - dlse_bht
    visible = _visible_blocks(qpos, qseg, kpos, kseg, bq, bk)
    params = _params(blocks.bwd_warps, blocks.stages)

    q_lo, q_hi = _range(visible)
    sp = _query_block_specs(t // bq, s, bq, d, g)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale, bk=bk),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(h, b, t // bq),
        in_specs=[
            sp["table"],
            sp["table"],
            sp["q"],
            sp["kv"],
            sp["kv"],
            sp["q"],
            sp["rows"],
            sp["rows"],
            sp["tokens"],
            sp["tokens"],
            sp["kv_tokens"],
            sp["kv_tokens"],
        ],
        out_specs=sp["q"],
        compiler_params=params,
        interpret=interpret,
        name="jaxswe_flash_dq",
    )(q_lo, q_hi, q, k, v, dout, lse_bht, delta, qpos, qseg, kpos, kseg)

    # Grid (KV head, row, key block): key block 0, which the most query blocks see, starts first.
    k_lo, k_hi = _range(visible.transpose(0, 2, 1))
    table = pl.BlockSpec((None, 1), lambda kh, bb, j: (bb, j))
    group_q = pl.BlockSpec((None, t, g, d), lambda kh, bb, j: (bb, 0, kh, 0))
    group_rows = pl.BlockSpec((None, g, t), lambda kh, bb, j: (bb, kh, 0))
    q_tokens = pl.BlockSpec((None, t), lambda kh, bb, j: (bb, 0))
    kv_block = pl.BlockSpec((None, bk, None, d), lambda kh, bb, j: (bb, j, kh, 0))
    kv_tokens = pl.BlockSpec((None, bk), lambda kh, bb, j: (bb, j))
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, scale=scale, bq=bq, groups=g),
        out_shape=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        grid=(kvh, b, s // bk),
        in_specs=[
            table,
            table,
            group_q,
            kv_block,
            kv_block,
            group_q,
            group_rows,
            group_rows,
            q_tokens,
            q_tokens,
            kv_tokens,
            kv_tokens,
        ],
        out_specs=(kv_block, kv_block),
        compiler_params=params,
        interpret=interpret,
        name="jaxswe_flash_dkv",
    )(k_lo, k_hi, q, k, v, dout, lse_bht, delta, qpos, qseg, kpos, kseg)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _flash(q, k, v, qpos, kpos, qseg, kseg, scale, blocks, interpret):
    return _forward(q, k, v, qpos, kpos, qseg, kseg, scale, blocks, interpret)


def _flash_fwd(q, k, v, qpos, kpos, qseg, kseg, scale, blocks, interpret):
    out, lse = _forward(q, k, v, qpos, kpos, qseg, kseg, scale, blocks, interpret)
    return (out, lse), (q, k, v, qpos, kpos, qseg, kseg, out, lse)


def _flash_bwd(scale, blocks, interpret, res, cts):
    q, k, v, qpos, kpos, qseg, kseg, out, lse = res
    dout, dlse = cts
    dq, dk, dv = _backward(q, k, v, qpos, kpos, qseg, kseg, out, lse, dout, dlse, scale, blocks, interpret)
    return dq, dk, dv, None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def pallas_flash_attention(
    q_bthd: jax.Array,
    k_bshd: jax.Array,
    v_bshd: jax.Array,
    *,
    q_positions: jax.Array,
    kv_positions: jax.Array,
    q_segment_ids: jax.Array,
    kv_segment_ids: jax.Array,
    scale: float,
    blocks: Blocks = Blocks(),
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Fused masked causal attention -> (out [B, T, H, D] in q's dtype, lse [B, T, H] float32).

    Inputs as for `sharding.flash.flash_attention` (which checks them); any T, S and head_dim.
    """
    b, t, h, d = q_bthd.shape
    s = k_bshd.shape[1]
    tp, sp = -(-t // blocks.multiple) * blocks.multiple, -(-s // blocks.multiple) * blocks.multiple
    dp = _pow2_at_least(d)
    pad_x = lambda x, n: pad_axis(pad_axis(x, n, 1), dp, 3)
    pad_t = lambda x, n: pad_axis(x.astype(jnp.int32), n, 1)
    out, lse = _flash(
        pad_x(q_bthd, tp), pad_x(k_bshd, sp), pad_x(v_bshd, sp),
        pad_t(q_positions, tp), pad_t(kv_positions, sp), pad_t(q_segment_ids, tp), pad_t(kv_segment_ids, sp),
        scale, blocks, interpret,
    )  # fmt: skip
    return out[:, :t, :, :d], lse[:, :, :t].transpose(0, 2, 1)
