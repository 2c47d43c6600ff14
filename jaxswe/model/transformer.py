"""Qwen2 decoder forward pass: pure functions of (params, config, ids, positions, segment ids).

Layers run under `jax.lax.scan` over the stacked `layers` axis (compile time independent of depth),
each wrapped in `jax.checkpoint` per `config.remat`. Compute is in `config.dtype`; RMSNorm,
RoPE and softmax in float32. Segment id 0 marks padding: a padding token attends to nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxswe.model.attention import AttentionFn, attention_from_config
from jaxswe.model.config import Qwen2Config
from jaxswe.model.params import Params
from jaxswe.model.precision import broadcast_weight, weight_einsum
from jaxswe.model.rope import apply_rope, rope_cos_sin
from sharding.logical import constrain
from sharding.vocab import embed_lookup

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "attn_out", "o_proj", "gate_proj", "up_proj", "down_proj")
ACT = ("batch", "length", "act_embed")


def rms_norm(x: jnp.ndarray, scale: jnp.ndarray, eps: float, grad_dtype=None) -> jnp.ndarray:
    """x / rms(x) in float32, cast back to x's dtype, times scale (transformers' order); scale's
    gradient is summed in `grad_dtype` (default x's dtype)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    normed = normed.astype(x.dtype)
    return broadcast_weight(scale, normed, grad_dtype or x.dtype) * normed


def default_positions(input_ids: jnp.ndarray, segment_ids: jnp.ndarray | None) -> jnp.ndarray:
    """0, 1, 2, ... restarting at the first token of every segment (one segment when None)."""
    b, t = input_ids.shape
    index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if segment_ids is None:
        return index
    starts = jnp.concatenate(
        [jnp.ones((b, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )  # fmt: skip
    return index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)


def qkv(h, lp, config: Qwen2Config, cos, sin):
    """Query [B,T,H,D], key and value [B,T,Hkv,D] with biases and RoPE applied."""
    gd = config.grad_reduce_dtype

    def proj(w, b, name):
        y = weight_einsum("bte,ehd->bthd", h, w, gd)
        return checkpoint_name(y + broadcast_weight(b, y, gd), name)

    q = proj(lp["wq"], lp["bq"], "q_proj")
    k = proj(lp["wk"], lp["bk"], "k_proj")
    v = proj(lp["wv"], lp["bv"], "v_proj")
    q = constrain(apply_rope(q, cos, sin), ("batch", "length", "act_heads", None))
    k = constrain(apply_rope(k, cos, sin), ("batch", "length", "act_kv_heads", None))
    v = constrain(v, ("batch", "length", "act_kv_heads", None))
    return q, k, v


def finish_layer(x, attn_bthd, lp, config: Qwen2Config):
    """Output projection + residual, then the SwiGLU MLP block + residual."""
    gd = config.grad_reduce_dtype
    attn_bthd = checkpoint_name(attn_bthd, "attn_out")
    o = checkpoint_name(weight_einsum("bthd,hde->bte", attn_bthd, lp["wo"], gd), "o_proj")
    x = constrain(x + o, ACT)
    h = rms_norm(x, lp["mlp_norm"], config.rms_norm_eps, gd)
    gate = checkpoint_name(weight_einsum("bte,ef->btf", h, lp["w_gate"], gd), "gate_proj")
    up = checkpoint_name(weight_einsum("bte,ef->btf", h, lp["w_up"], gd), "up_proj")
    act = constrain(jax.nn.silu(gate) * up, ("batch", "length", "act_mlp"))
    down = checkpoint_name(weight_einsum("btf,fe->bte", act, lp["w_down"], gd), "down_proj")
    return constrain(x + down, ACT)


def remat_policy(config: Qwen2Config) -> Callable | None:
    """jax.checkpoint policy for `config.remat` (None means no rematerialization)."""
    if config.remat == "none":
        return None
    if config.remat == "full":
        return jax.checkpoint_policies.nothing_saveable
    return jax.checkpoint_policies.save_only_these_names(*_PROJECTIONS)


def embed(params: Params, config: Qwen2Config, input_ids: jnp.ndarray) -> jnp.ndarray:
    """Token embeddings [B, T, E] in `config.dtype` (no whole-table gather: `sharding.embed_lookup`)."""
    grad_dtype = jnp.promote_types(config.grad_reduce_dtype, config.dtype)
    return constrain(embed_lookup(params["embed"], input_ids, config.dtype, grad_dtype), ACT)


def forward(
    params: Params,
    config: Qwen2Config,
    input_ids: jnp.ndarray,
    positions: jnp.ndarray | None = None,
    segment_ids: jnp.ndarray | None = None,
    *,
    attention_fn: AttentionFn | None = None,
) -> jnp.ndarray:
    """Final hidden states [B, T, E] (after the last RMSNorm) in `config.dtype`.

    `positions` default to 0.. within each segment; `segment_ids` [B, T] (0 = padding) keep packed
    sequences from attending to each other. `attention_fn` overrides `config.attention`.
    """
    chex.assert_rank(input_ids, 2)
    if positions is None:
        positions = default_positions(input_ids, segment_ids)
    chex.assert_equal_shape([input_ids, positions] + ([] if segment_ids is None else [segment_ids]))
    attend = attention_fn or attention_from_config(config.attention, config.attention_block)
    cos, sin = rope_cos_sin(config, positions)

    def layer(x, lp):
        h = rms_norm(x, lp["attn_norm"], config.rms_norm_eps, config.grad_reduce_dtype)
        q, k, v = qkv(h, lp, config, cos, sin)
        out = attend(q, k, v, q_positions=positions, kv_positions=positions, q_segment_ids=segment_ids,
                     kv_segment_ids=segment_ids)  # fmt: skip
        return finish_layer(x, out, lp, config), None

    policy = remat_policy(config)
    if policy is not None:
        layer = jax.checkpoint(layer, policy=policy, prevent_cse=False)
    x, _ = jax.lax.scan(layer, embed(params, config, input_ids), params["layers"])
    return rms_norm(x, params["final_norm"], config.rms_norm_eps, config.grad_reduce_dtype)


def unembedding(params: Params) -> jnp.ndarray:
    """The [E, V] output projection (the transposed embedding when tied)."""
    return params["lm_head"] if "lm_head" in params else params["embed"].T


def project_vocab(params: Params, hidden_bte: jnp.ndarray) -> jnp.ndarray:
    """float32 logits [B, T, V] of hidden states (keep T small: this is the big array)."""
    w = unembedding(params).astype(hidden_bte.dtype)
    logits = jnp.einsum("bte,ev->btv", hidden_bte, w, preferred_element_type=jnp.float32)
    return constrain(logits, ("batch", "length", "act_vocab"))


def logits(
    params: Params,
    config: Qwen2Config,
    input_ids: jnp.ndarray,
    positions: jnp.ndarray | None = None,
    segment_ids: jnp.ndarray | None = None,
    *,
    attention_fn: AttentionFn | None = None,
) -> jnp.ndarray:
    """Full float32 logits [B, T, V]; for short sequences (use token_logprobs for long ones)."""
    hidden = forward(params, config, input_ids, positions, segment_ids, attention_fn=attention_fn)
    return project_vocab(params, hidden)
