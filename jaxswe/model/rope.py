"""Rotate-half rotary position embeddings with optional YaRN scaling (as transformers computes them)."""

from __future__ import annotations

import math

import chex
import jax.numpy as jnp
import numpy as np

from jaxswe.model.config import Qwen2Config, YarnScaling


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_range(yarn: YarnScaling, dim: int, base: float) -> tuple[float, float]:
    def correction_dim(rotations: float) -> float:
        return (
            dim
            * math.log(yarn.original_max_position_embeddings / (rotations * 2 * math.pi))
            / (2 * math.log(base))
        )

    low, high = correction_dim(yarn.beta_fast), correction_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def rope_frequencies(config: Qwen2Config) -> tuple[np.ndarray, float]:
    """(inverse frequencies [head_dim/2] float32, attention factor applied to cos and sin)."""
    dim, base = config.head_dim, config.rope_theta
    pos_freqs = (base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))).astype(np.float32)
    inv_freq = (1.0 / pos_freqs).astype(np.float32)
    yarn = config.rope_scaling
    if yarn is None:
        return inv_freq, 1.0
    factor = yarn.factor
    if yarn.attention_factor is not None:
        attention_factor = yarn.attention_factor
    elif yarn.mscale and yarn.mscale_all_dim:
        attention_factor = _yarn_mscale(factor, yarn.mscale) / _yarn_mscale(factor, yarn.mscale_all_dim)
    else:
        attention_factor = _yarn_mscale(factor)
    low, high = _yarn_correction_range(yarn, dim, base)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    extrapolation = (1 - ramp).astype(np.float32)
    interpolation = (1.0 / (factor * pos_freqs)).astype(np.float32)
    inv_freq = interpolation * (1 - extrapolation) + inv_freq * extrapolation
    return inv_freq.astype(np.float32), float(attention_factor)


def rope_cos_sin(config: Qwen2Config, positions_bt: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos and sin [B, T, head_dim] float32 for integer positions [B, T], attention factor included."""
    chex.assert_rank(positions_bt, 2)
    inv_freq, attention_factor = rope_frequencies(config)
    angles_btf = positions_bt.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    angles_btd = jnp.concatenate([angles_btf, angles_btf], axis=-1)
    return jnp.cos(angles_btd) * attention_factor, jnp.sin(angles_btd) * attention_factor


def apply_rope(x_bthd: jnp.ndarray, cos_btd: jnp.ndarray, sin_btd: jnp.ndarray) -> jnp.ndarray:
    """x * cos + rotate_half(x) * sin, computed in float32, returned in x's dtype."""
    chex.assert_rank(x_bthd, 4)
    x = x_bthd.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out = x * cos_btd[:, :, None, :] + rotated * sin_btd[:, :, None, :]
    return out.astype(x_bthd.dtype)
