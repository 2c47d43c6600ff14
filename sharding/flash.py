"""Blockwise (flash) attention on one device that also returns the log-sum-exp of each query row.

`flash_attention` never materializes the [T, S] score matrix: queries and keys are cut into
blocks, blocks whose mask is empty are skipped (causal upper triangle, other segments), and the
backward pass (custom VJP) recomputes each block's probabilities from the saved log-sum-exp, so
only q, k, v, the output and the lse are kept for the gradient. The lse output lets callers merge
results over several key/value chunks (context-parallel ring attention).

Masking: query t sees key s iff same nonzero segment id and kv_position[s] <= q_position[t].
Shapes: q [B, T, H, D], k/v [B, S, K, D] with H a multiple of K (GQA), positions/segments [B, T] / [B, S].

`impl` picks the kernel: "blockwise" (this module: the reference, and the path on CPU/TPU),
"pallas" (sharding.pallas_flash: fused Pallas kernels; on a non-GPU backend they run in interpret
mode) or "auto" (pallas on NVIDIA GPUs, else blockwise).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp

from sharding.errors import ShardingError
from sharding.pallas_flash import NEG, Blocks, pad_axis, pallas_flash_attention

IMPLS = ("auto", "blockwise", "pallas")


def on_nvidia_gpu(devices: Sequence[jax.Device] | None = None) -> bool:
    """Whether `devices` (default: the default backend's) are NVIDIA GPUs, real or compile-only (a
    deviceless topology's), where the fused Pallas kernels lower through Triton."""
    device = list(devices if devices is not None else jax.devices())[0]
    if device.platform != "gpu":
        return False
    return "nvidia" in device.device_kind.lower() or "cuda" in device.client.platform_version.lower()


def resolve_impl(impl: str, devices: Sequence[jax.Device] | None = None) -> str:
    """ "auto" -> "pallas" when `devices` (the compile target; default: the default backend's) are
    NVIDIA GPUs, else "blockwise"; other names are checked and returned."""
    if impl not in IMPLS:
        raise ShardingError(f"flash attention impl {impl!r} not in {IMPLS}")
    if impl == "auto":
        return "pallas" if on_nvidia_gpu(devices) else "blockwise"
    return impl


def _mask(qpos_bq, qseg_bq, kpos_bk, kseg_bk):
    same = (qseg_bq[:, :, None] == kseg_bk[:, None, :]) & (qseg_bq[:, :, None] != 0)
    return same & (qpos_bq[:, :, None] >= kpos_bk[:, None, :])


def _split_q(x_bthd, bq, kvh):
    b, t, h, d = x_bthd.shape
    x = x_bthd.reshape(b, t // bq, bq, kvh, h // kvh, d)
    return x.transpose(1, 0, 3, 4, 2, 5)  # [nq, B, K, G, bq, D]


def _merge_q(x_nbkgqd):
    nq, b, kvh, g, bq, d = x_nbkgqd.shape
    return x_nbkgqd.transpose(1, 0, 4, 2, 3, 5).reshape(b, nq * bq, kvh * g, d)


def _split_rows(x_bth, bq, kvh):
    b, t, h = x_bth.shape
    return x_bth.reshape(b, t // bq, bq, kvh, h // kvh).transpose(1, 0, 3, 4, 2)  # [nq, B, K, G, bq]


def _merge_rows(x_nbkgq):
    nq, b, kvh, g, bq = x_nbkgq.shape
    return x_nbkgq.transpose(1, 0, 4, 2, 3).reshape(b, nq * bq, kvh * g)


def _split_kv(x_bskd, bk):
    b, s, kvh, d = x_bskd.shape
    return x_bskd.reshape(b, s // bk, bk, kvh, d).transpose(1, 0, 3, 2, 4)  # [nk, B, K, bk, D]


def _merge_kv(x_nbkkd):
    nk, b, kvh, bk, d = x_nbkkd.shape
    return x_nbkkd.transpose(1, 0, 3, 2, 4).reshape(b, nk * bk, kvh, d)


def _split_tokens(x_bt, blk):
    b, t = x_bt.shape
    return x_bt.reshape(b, t // blk, blk).transpose(1, 0, 2)  # [n, B, blk]


def _scores(q_bkgqd, k_bkkd, scale):
    return jnp.einsum("bhgqd,bhkd->bhgqk", q_bkgqd, k_bkkd, preferred_element_type=jnp.float32) * scale


def _forward(q, k, v, qpos, kpos, qseg, kseg, scale, block_q, block_kv):
    # Tie positions/segments to q/k/v: inside a scan over layers they are loop-invariant, and
    # JAX would otherwise hoist every block's mask out of the loop, materializing [T, S] masks.
    q, k, v, qpos, kpos, qseg, kseg = jax.lax.optimization_barrier((q, k, v, qpos, kpos, qseg, kseg))
    kvh, bq, bk = k.shape[2], block_q, block_kv
    kb, vb = _split_kv(k, bk), _split_kv(v, bk)
    kpb, ksb = _split_tokens(kpos, bk), _split_tokens(kseg, bk)

    def q_block(args):
        q_i, qpos_i, qseg_i = args  # [B, K, G, bq, D], [B, bq], [B, bq]

        def kv_step(carry, kv):
            k_j, v_j, kpos_j, kseg_j = kv
            mask = _mask(qpos_i, qseg_i, kpos_j, kseg_j)[:, None, None]  # [B, 1, 1, bq, bk]

            def update(c):
                m, l, o = c
                s = jnp.where(mask, _scores(q_i, k_j, scale), NEG)
                m_new = jnp.maximum(m, s.max(-1))
                p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
                corr = jnp.exp(m - m_new)
                pv = jnp.einsum(
                    "bhgqk,bhkd->bhgqd", p.astype(v_j.dtype), v_j, preferred_element_type=jnp.float32
                )
                return m_new, l * corr + p.sum(-1), o * corr[..., None] + pv

            return jax.lax.cond(mask.any(), update, lambda c: c, carry), None

        shape = q_i.shape[:-1]
        init = (
            jnp.full(shape, NEG, jnp.float32),
            jnp.zeros(shape, jnp.float32),
            jnp.zeros(q_i.shape, jnp.float32),
        )
        (m, l, o), _ = jax.lax.scan(kv_step, init, (kb, vb, kpb, ksb))
        out = o / jnp.where(l > 0, l, 1.0)[..., None]
        lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), NEG)
        return out, lse

    out, lse = jax.lax.map(q_block, (_split_q(q, bq, kvh), _split_tokens(qpos, bq), _split_tokens(qseg, bq)))
    return _merge_q(out).astype(q.dtype), _merge_rows(lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _flash(q, k, v, qpos, kpos, qseg, kseg, scale, block_q, block_kv):
    return _forward(q, k, v, qpos, kpos, qseg, kseg, scale, block_q, block_kv)


def _flash_fwd(q, k, v, qpos, kpos, qseg, kseg, scale, block_q, block_kv):
    out, lse = _forward(q, k, v, qpos, kpos, qseg, kseg, scale, block_q, block_kv)
    return (out, lse), (q, k, v, qpos, kpos, qseg, kseg, out, lse)


def _flash_bwd(scale, block_q, block_kv, res, cts):
    q, k, v, qpos, kpos, qseg, kseg, out, lse = res
    dout, dlse = cts
    q, k, v, qpos, kpos, qseg, kseg = jax.lax.optimization_barrier((q, k, v, qpos, kpos, qseg, kseg))
    kvh, bq, bk = k.shape[2], block_q, block_kv
    # d lse_t / d s_tk = p_tk, so an lse cotangent enters like a shift of the row term `delta`.
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1) - dlse
    qb, dob = _split_q(q, bq, kvh), _split_q(dout, bq, kvh)
    lseb, deltab = _split_rows(lse, bq, kvh), _split_rows(delta, bq, kvh)
    qpb, qsb = _split_tokens(qpos, bq), _split_tokens(qseg, bq)
    nq = qb.shape[0]

    def kv_block(dq_acc, kv):
        k_j, v_j, kpos_j, kseg_j = kv

        def q_step(carry, xs):
            dk_j, dv_j, dq = carry
            i, q_i, do_i, lse_i, delta_i, qpos_i, qseg_i = xs
            mask = _mask(qpos_i, qseg_i, kpos_j, kseg_j)[:, None, None]

            def update(c):
                dk_j, dv_j, dq = c
                p = jnp.where(mask, jnp.exp(_scores(q_i, k_j, scale) - lse_i[..., None]), 0.0)
                dv_j = dv_j + jnp.einsum("bhgqk,bhgqd->bhkd", p, do_i.astype(jnp.float32))
                dp = jnp.einsum("bhgqd,bhkd->bhgqk", do_i, v_j, preferred_element_type=jnp.float32)
                ds = p * (dp - delta_i[..., None]) * scale
                dq_i = jnp.einsum("bhgqk,bhkd->bhgqd", ds, k_j.astype(jnp.float32))
                dk_j = dk_j + jnp.einsum("bhgqk,bhgqd->bhkd", ds, q_i.astype(jnp.float32))
                return dk_j, dv_j, dq.at[i].add(dq_i)

            return jax.lax.cond(mask.any(), update, lambda c: c, carry), None

        zeros = jnp.zeros(k_j.shape, jnp.float32)
        (dk_j, dv_j, dq_acc), _ = jax.lax.scan(
            q_step, (zeros, zeros, dq_acc), (jnp.arange(nq), qb, dob, lseb, deltab, qpb, qsb)
        )
        return dq_acc, (dk_j, dv_j)

    kv_xs = (_split_kv(k, bk), _split_kv(v, bk), _split_tokens(kpos, bk), _split_tokens(kseg, bk))
    dq, (dk, dv) = jax.lax.scan(kv_block, jnp.zeros(qb.shape, jnp.float32), kv_xs)
    return (
        _merge_q(dq).astype(q.dtype),
        _merge_kv(dk).astype(k.dtype),
        _merge_kv(dv).astype(v.dtype),
        None,
        None,
        None,
        None,
    )


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(
    q_bthd: jax.Array,
    k_bshd: jax.Array,
    v_bshd: jax.Array,
    *,
    q_positions: jax.Array,
    kv_positions: jax.Array,
    q_segment_ids: jax.Array,
    kv_segment_ids: jax.Array,
    scale: float | None = None,
    block_q: int = 512,
    block_kv: int = 512,
    impl: str = "auto",
    pallas_blocks: Blocks = Blocks(),
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Masked causal attention -> (out [B, T, H, D] in q's dtype, lse [B, T, H] float32).

    Rows that see no key (padding, segment 0) give out 0 and lse NEG. Blockwise: blocks are
    min(block, length) and lengths are padded to a multiple (segment 0: invisible), so memory stays
    O(T * block) for any T. `pallas_blocks` tiles the fused path; `interpret` runs it in Pallas's
    interpreter (default: unless the default backend is an NVIDIA GPU).
    """
    chex.assert_rank([q_bthd, k_bshd, v_bshd], 4)
    chex.assert_equal_shape([k_bshd, v_bshd])
    chex.assert_shape([q_positions, q_segment_ids], q_bthd.shape[:2])
    chex.assert_shape([kv_positions, kv_segment_ids], k_bshd.shape[:2])
    chex.assert_equal(q_bthd.shape[-1], k_bshd.shape[-1])
    if q_bthd.shape[2] % k_bshd.shape[2]:
        raise ValueError(f"query heads {q_bthd.shape[2]} are not a multiple of kv heads {k_bshd.shape[2]}")
    scale = q_bthd.shape[-1] ** -0.5 if scale is None else float(scale)
    if resolve_impl(impl) == "pallas":
        return pallas_flash_attention(
            q_bthd,
            k_bshd,
            v_bshd,
            q_positions=q_positions,
            kv_positions=kv_positions,
            q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids,
            scale=scale,
            blocks=pallas_blocks,
            interpret=not on_nvidia_gpu() if interpret is None else interpret,
        )
    t, s = q_bthd.shape[1], k_bshd.shape[1]
    bq, bk = min(block_q, t), min(block_kv, s)
    tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
    pad_t = lambda x, n: pad_axis(x.astype(jnp.int32), n, 1)
    out, lse = _flash(
        pad_axis(q_bthd, tp, 1), pad_axis(k_bshd, sp, 1), pad_axis(v_bshd, sp, 1),
        pad_t(q_positions, tp), pad_t(kv_positions, sp), pad_t(q_segment_ids, tp), pad_t(kv_segment_ids, sp),
        scale, bq, bk,
    )  # fmt: skip
    return out[:, :t], lse[:, :t]
