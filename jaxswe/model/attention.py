"""Causal, segment-aware grouped-query attention, selected by `model.attention` everywhere.

Kinds (`attention_from_config`): "auto" | "blockwise" | "pallas" are the one flash kernel,
`sharding.flash.flash_attention` (blockwise pure JAX; fused Pallas; auto = Pallas on NVIDIA GPUs,
blockwise elsewhere); "dense" is the reference materializing [T, S] scores; "cudnn" is cuDNN's
fused kernel through `jax.nn.dot_product_attention`, for unpacked rows only (the embedded engine).
`mesh_attention` is what a sharded train step and the recompute pass run.

Every attention function has the signature
`fn(q_bthd, k_bshd, v_bshd, *, q_positions, kv_positions, q_segment_ids, kv_segment_ids) -> out_bthd`
with `H` query heads and `Hkv` key/value heads (`H % Hkv == 0`). Query `t` sees key `s` iff both
carry the same segment id, that id is not 0 (0 marks padding), and `kv_positions[s] <= q_positions[t]`.
Segment ids None means one segment. A query that sees no key gets a zero output.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxswe.model.config import ModelConfigError
from sharding.context import context_size, make_context_attention
from sharding.flash import IMPLS as FLASH_IMPLS
from sharding.flash import flash_attention
from sharding.logical import Rules

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


def flash_attention_fn(impl: str, block: int) -> AttentionFn:
    """`sharding.flash.flash_attention` (impl auto | blockwise | pallas, `block` tokens per q/kv
    block of the blockwise kernel) as an AttentionFn; segment ids None mean one segment."""

    def attend(q_bthd, k_bshd, v_bshd, *, q_positions, kv_positions, q_segment_ids=None,
               kv_segment_ids=None) -> jnp.ndarray:  # fmt: skip
        _, q_seg, kv_seg = _check(
            q_bthd, k_bshd, v_bshd, q_positions, kv_positions, q_segment_ids, kv_segment_ids
        )
        out, _ = flash_attention(
            q_bthd, k_bshd, v_bshd, q_positions=q_positions, kv_positions=kv_positions,
            q_segment_ids=q_seg, kv_segment_ids=kv_seg, block_q=block, block_kv=block, impl=impl,
        )  # fmt: skip
        return out

    return attend


def cudnn_attention(q_bthd, k_bshd, v_bshd, *, q_positions, kv_positions, q_segment_ids=None,
                    kv_segment_ids=None, implementation: str = "cudnn") -> jnp.ndarray:  # fmt: skip
    """cuDNN fused attention (NVIDIA GPUs) for rows that each hold one sequence from position 0,
    then padding: the engine's right-padded prompts (T == S, causal by index) and its decode step
    (one query against the cache). cuDNN takes per-row lengths, not segment ids: the lengths are
    the counts of nonzero segment ids, so packed rows cannot be expressed (`mesh_attention`
    refuses "cudnn" for training). `implementation="xla"` runs the same call on any backend.
    """
    del q_positions, kv_positions
    t, s = q_bthd.shape[1], k_bshd.shape[1]
    if t not in (s, 1):
        raise ModelConfigError(f"attention 'cudnn' takes T == S or one query, got T={t}, S={s}")
    lengths = lambda seg: None if seg is None else jnp.sum(seg != 0, axis=1).astype(jnp.int32)
    out = jax.nn.dot_product_attention(
        q_bthd, k_bshd, v_bshd, is_causal=t == s, query_seq_lengths=lengths(q_segment_ids),
        key_value_seq_lengths=lengths(kv_segment_ids), implementation=implementation,
    )  # fmt: skip
    if q_segment_ids is None:
        return out
    return jnp.where((q_segment_ids != 0)[:, :, None, None], out, 0).astype(q_bthd.dtype)


def attention_from_config(kind: str, block: int) -> AttentionFn:
    """The attention function `model.attention` (`kind`) and `model.attention_block` name."""
    if kind == "dense":
        return dense_attention
    if kind == "cudnn":
        return cudnn_attention
    if kind in FLASH_IMPLS:
        return flash_attention_fn(kind, block)
    raise ModelConfigError(f"model.attention {kind!r} not in {(*FLASH_IMPLS, 'dense', 'cudnn')}")


def mesh_attention(kind: str, block: int, mesh: Mesh, rules: Rules, context_kind: str) -> AttentionFn:
    """The attention a sharded train step or recompute pass runs for `model.attention` = `kind`.

    Flash kinds go through `sharding.context.make_context_attention` (shard_map over batch and
    heads; ring or all-gather, `context_kind`, over a context axis). "dense" runs as is, without
    context parallelism only; "cudnn" cannot express packed rows, so it cannot train.
    """
    n = context_size(mesh, rules)
    if kind == "cudnn":
        raise ModelConfigError(
            "model.attention 'cudnn' cannot train: training rows are packed (segment ids) and cuDNN "
            "takes only per-row lengths; use auto, pallas or blockwise"
        )
    if kind == "dense":
        if n > 1:
            raise ModelConfigError(
                f"model.attention 'dense' has no context-parallel form (each sequence is split over {n} "
                "devices); use auto, blockwise or pallas"
            )
        return dense_attention
    return make_context_attention(mesh, rules, context_kind, block=block, impl=kind)
