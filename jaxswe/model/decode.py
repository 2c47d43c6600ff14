"""KV-cached decoding for the sampler: static shapes, jit-friendly.

The cache holds, for every layer, keys and values of `max_len` slots per sequence, and each
sequence's length. Slot i holds the token at position i; slots at or beyond the length are
invisible (segment id 0), so right-padded prompts of different lengths share one batch.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp

from jaxswe.model.attention import attention_from_config
from jaxswe.model.config import Qwen2Config
from jaxswe.model.params import Params
from jaxswe.model.rope import rope_cos_sin
from jaxswe.model.transformer import embed, finish_layer, project_vocab, qkv, rms_norm

Cache = dict[str, Any]


def init_cache(config: Qwen2Config, batch: int, max_len: int, dtype=None) -> Cache:
    """Empty cache: k, v [L, B, max_len, Hkv, D] (dtype defaults to config.dtype), lengths [B] int32."""
    dtype = jnp.dtype(dtype or config.dtype)
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    return {
        "k": jnp.zeros(shape, dtype),
        "v": jnp.zeros(shape, dtype),
        "lengths": jnp.zeros((batch,), jnp.int32),
    }


def _slot_view(cache: Cache) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Positions and segment ids [B, max_len] of the cache slots (1 where filled, else 0)."""
    b, s = cache["k"].shape[1], cache["k"].shape[2]
    slots = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    return slots, (slots < cache["lengths"][:, None]).astype(jnp.int32)


def _final_logits(params: Params, config: Qwen2Config, x_btE: jnp.ndarray) -> jnp.ndarray:
    hidden = rms_norm(x_btE, params["final_norm"], config.rms_norm_eps)
    return project_vocab(params, hidden)[:, 0]


def prefill(
    params: Params, config: Qwen2Config, input_ids_bt: jnp.ndarray, lengths_b: jnp.ndarray, cache: Cache
) -> tuple[jnp.ndarray, Cache]:
    """Run right-padded prompts [B, T] (true lengths [B], each >= 1) into an empty cache.

    Returns the float32 logits [B, V] at each prompt's last token and the filled cache.
    """
    chex.assert_rank(input_ids_bt, 2)
    b, t = input_ids_bt.shape
    chex.assert_shape(lengths_b, (b,))
    if t > cache["k"].shape[2]:
        raise ValueError(f"prefill: prompt length {t} exceeds cache max_len {cache['k'].shape[2]}")
    dt = cache["k"].dtype
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    segment_ids = (positions < lengths_b[:, None]).astype(jnp.int32)
    cos, sin = rope_cos_sin(config, positions)
    attend = attention_from_config(config.attention, config.attention_block)

    def layer(x, lp):
        h = rms_norm(x, lp["attn_norm"], config.rms_norm_eps)
        q, k, v = qkv(h, lp, config, cos, sin)
        out = attend(q, k, v, q_positions=positions, kv_positions=positions, q_segment_ids=segment_ids,
                     kv_segment_ids=segment_ids)  # fmt: skip
        return finish_layer(x, out, lp, config), (k.astype(dt), v.astype(dt))

    x, (k_lbthd, v_lbthd) = jax.lax.scan(layer, embed(params, config, input_ids_bt), params["layers"])
    cache = {
        "k": jax.lax.dynamic_update_slice_in_dim(cache["k"], k_lbthd, 0, axis=2),
        "v": jax.lax.dynamic_update_slice_in_dim(cache["v"], v_lbthd, 0, axis=2),
        "lengths": lengths_b.astype(jnp.int32),
    }
    last = jnp.take_along_axis(x, (lengths_b - 1)[:, None, None].astype(jnp.int32), axis=1)
    return _final_logits(params, config, last), cache


def decode_step(
    params: Params, config: Qwen2Config, tokens_b: jnp.ndarray, cache: Cache
) -> tuple[jnp.ndarray, Cache]:
    """Append one token per sequence at position `lengths`; return float32 next-token logits [B, V]."""
    chex.assert_rank(tokens_b, 1)
    b = tokens_b.shape[0]
    dt = cache["k"].dtype
    positions = cache["lengths"][:, None]
    cos, sin = rope_cos_sin(config, positions)
    new_cache_view = {**cache, "lengths": cache["lengths"] + 1}
    kv_positions, kv_segments = _slot_view(new_cache_view)
    rows = jnp.arange(b)
    attend = attention_from_config(config.attention, config.attention_block)

    def layer(x, xs):
        lp, k_cache, v_cache = xs
        h = rms_norm(x, lp["attn_norm"], config.rms_norm_eps)
        q, k, v = qkv(h, lp, config, cos, sin)
        k_cache = k_cache.at[rows, cache["lengths"]].set(k[:, 0].astype(dt))
        v_cache = v_cache.at[rows, cache["lengths"]].set(v[:, 0].astype(dt))
        out = attend(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype), q_positions=positions,
                     kv_positions=kv_positions, q_segment_ids=jnp.ones((b, 1), jnp.int32),
                     kv_segment_ids=kv_segments)  # fmt: skip
        return finish_layer(x, out, lp, config), (k_cache, v_cache)

    x, (k_new, v_new) = jax.lax.scan(layer, embed(params, config, tokens_b[:, None]),
                                     (params["layers"], cache["k"], cache["v"]))  # fmt: skip
    return _final_logits(params, config, x), {"k": k_new, "v": v_new, "lengths": new_cache_view["lengths"]}
