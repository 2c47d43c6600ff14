"""Losses and reward arithmetic of RFT and DAPO (pure, jit-able, chex-asserted).

Shapes: B trajectories (or packed rows), T tokens, P problems, G rollouts per problem.
Every normalizer is guarded so that an all-masked batch gives 0, never NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import chex
import jax
import jax.numpy as jnp

# exp() of a log-ratio beyond this would overflow float32 gradients; real ratios never get here.
_MAX_LOG_RATIO = 60.0


@dataclass(frozen=True)
class LossSettings:
    """The DAPO objective's settings, built once from the config's `rl` section (`from_rl`) and
    read by the train step: `dapo_loss`'s clip range, entropy bonus and negative-side knobs,
    `off_policy_weights`' truncation cap (None: off) and trajectory mask."""

    eps_low: float = 0.2
    eps_high: float = 0.28
    entropy_coef: float = 0.0
    tis_cap: float | None = None
    sequence_mask: str = "none"
    mask_threshold: float = 2.0
    negative_weight: float = 1.0
    negative_prob_floor: float = 0.0

    @classmethod
    def from_rl(cls, rl: Any) -> LossSettings:
        """From a config's `rl` section (truncated importance sampling when `rl.tis_on`)."""
        return cls(
            rl.eps_low, rl.eps_high, rl.entropy_coef, rl.tis_cap if rl.tis_on else None,
            rl.sequence_mask, rl.mask_threshold,
            negative_weight=rl.negative_weight, negative_prob_floor=rl.negative_prob_floor,
        )  # fmt: skip

    @property
    def off_policy(self) -> bool:
        """Whether tokens are weighted by `off_policy_weights` (which reads the rollout log-probs)."""
        return self.tis_cap is not None or self.sequence_mask != "none"


def _normalizer(mask_bt: jax.Array, num_tokens: jax.Array | float | None) -> jax.Array:
    n = jnp.sum(mask_bt) if num_tokens is None else jnp.asarray(num_tokens, jnp.float32)
    return jnp.maximum(n, 1.0)


def _masked_mean(x_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(mask_bt > 0, x_bt, 0.0)) / jnp.maximum(jnp.sum(mask_bt), 1.0)


def negative_side_weights(
    logprobs: jax.Array, advantages: jax.Array, *, negative_weight: float = 1.0, prob_floor: float = 0.0
) -> jax.Array:
    """Per-token weights [B, T] (no gradient) of the policy gradient's negative side: 1 where the
    advantage [B, T] is >= 0; where it is < 0, `negative_weight`, or 0 when the token's probability
    under the current policy, exp(logprobs), is below `prob_floor` (no push-down on a token the
    policy has already all but given up)."""
    chex.assert_equal_shape([logprobs, advantages])
    if not 0.0 <= prob_floor < 1.0:
        raise ValueError(f"prob_floor {prob_floor} is not in [0, 1)")
    if negative_weight < 0.0:
        raise ValueError(f"negative_weight {negative_weight} is negative")
    above_floor_bt = jax.lax.stop_gradient(logprobs) >= jnp.log(jnp.float32(prob_floor))
    negative_bt = jnp.where(above_floor_bt, negative_weight, 0.0).astype(logprobs.dtype)
    return jnp.where(advantages < 0, negative_bt, jnp.ones_like(negative_bt))


def dapo_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    num_tokens: jax.Array | float | None = None,
    token_weights: jax.Array | None = None,
    entropy: jax.Array | None = None,
    entropy_coef: float = 0.0,
    negative_weight: float = 1.0,
    negative_prob_floor: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-level clipped policy-gradient loss of DAPO (no KL term).

    loss = -sum(mask * w * min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)) / N with
    rho = exp(logprobs - old_logprobs), N = num_tokens (global count over micro-batches and
    devices) or sum(mask). `advantages` is [B] (one per trajectory) or [B, T] (per token, for rows
    that pack several trajectories). `token_weights` (optional, [B, T], no gradient) scales each token,
    e.g. truncated importance weights for a rollout/trainer mismatch. With `entropy_coef` > 0 the
    loss also subtracts entropy_coef * sum(mask * entropy) / N, an exploration bonus on the policy's
    entropy [B, T] at each token (DAPO itself has none, so it is off by default).
    `negative_weight` and `negative_prob_floor` weight the tokens of negative advantage
    (`negative_side_weights`; at 1.0 and 0.0, the defaults, DAPO's loss is computed unchanged); N
    stays the count of every trained token.
    aux holds masked means over this call's tokens: clip_fraction (the clip binds),
    clip_low_fraction, clip_high_fraction, approx_kl (k3 estimate of KL(old || new)),
    ratio_mean, ratio_max and num_tokens (this call's unmasked tokens); with a floor,
    prob_floor_fraction (tokens of negative advantage the floor left out).
    """
    chex.assert_rank([logprobs, old_logprobs, mask], 2)
    chex.assert_equal_shape([logprobs, old_logprobs, mask])
    chex.assert_type([logprobs, old_logprobs, advantages], float)
    if advantages.ndim == 1:
        chex.assert_shape(advantages, (logprobs.shape[0],))
        advantages = advantages[:, None]
    else:
        chex.assert_equal_shape([advantages, logprobs])
    on_bt = mask > 0
    log_ratio_bt = jnp.where(on_bt, logprobs - old_logprobs, 0.0)
    log_ratio_bt = jnp.clip(log_ratio_bt, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio_bt = jnp.exp(log_ratio_bt)
    adv_bt = advantages.astype(logprobs.dtype)
    unclipped_bt = ratio_bt * adv_bt
    clipped_bt = jnp.clip(ratio_bt, 1.0 - eps_low, 1.0 + eps_high) * adv_bt
    objective_bt = jnp.minimum(unclipped_bt, clipped_bt)
    weight_bt = mask.astype(objective_bt.dtype)
    if token_weights is not None:
        chex.assert_equal_shape([token_weights, mask])
        weight_bt = weight_bt * jax.lax.stop_gradient(token_weights)
    if negative_weight != 1.0 or negative_prob_floor > 0.0:
        side_bt = negative_side_weights(
            logprobs, jnp.broadcast_to(adv_bt, logprobs.shape),
            negative_weight=negative_weight, prob_floor=negative_prob_floor,
        )  # fmt: skip
        weight_bt = weight_bt * side_bt
    loss = -jnp.sum(jnp.where(on_bt, weight_bt * objective_bt, 0.0)) / _normalizer(mask, num_tokens)
    if entropy_coef:
        chex.assert_equal_shape([entropy, mask])
        loss = loss - entropy_coef * jnp.sum(jnp.where(on_bt, entropy, 0.0)) / _normalizer(mask, num_tokens)

    ratio_sg = jax.lax.stop_gradient(ratio_bt)
    low_bt = (adv_bt < 0) & (ratio_sg < 1.0 - eps_low)
    high_bt = (adv_bt > 0) & (ratio_sg > 1.0 + eps_high)
    log_ratio_sg = jax.lax.stop_gradient(log_ratio_bt)
    aux = {
        "clip_fraction": _masked_mean((low_bt | high_bt).astype(jnp.float32), mask),
        "clip_low_fraction": _masked_mean(low_bt.astype(jnp.float32), mask),
        "clip_high_fraction": _masked_mean(high_bt.astype(jnp.float32), mask),
        "approx_kl": _masked_mean(ratio_sg - 1.0 - log_ratio_sg, mask),
        "ratio_mean": _masked_mean(ratio_sg, mask),
        "ratio_max": jnp.max(jnp.where(on_bt, ratio_sg, 0.0)),
        "num_tokens": jnp.sum(mask).astype(jnp.float32),
    }
    if negative_prob_floor > 0.0:
        floored_bt = (adv_bt < 0) & (jax.lax.stop_gradient(logprobs) < jnp.log(negative_prob_floor))
        aux["prob_floor_fraction"] = _masked_mean(floored_bt.astype(jnp.float32), mask)
    chex.assert_shape(loss, ())
    return loss, aux


SEQUENCE_MASKS = ("none", "sequence", "geometric")


def off_policy_weights(
    old_logprobs: jax.Array,
    rollout_logprobs: jax.Array,
    mask: jax.Array,
    segment_ids: jax.Array,
    *,
    tis_cap: float | None = None,
    sequence_mask: str = "none",
    mask_threshold: float = 2.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token weights [B, T] (no gradient) for tokens sampled by the rollout policy rather than
    the trainer's old policy (engine/trainer numerics, or a policy some versions behind).

    With log-ratio d_t = old_t - rollout_t: token-level truncated importance sampling gives
    w_t = min(exp(d_t), tis_cap) (when `tis_cap`), else 1. `sequence_mask` then zeroes every token
    of a trajectory (a segment of a row) whose ratio lies outside [1/mask_threshold, mask_threshold]:
    "sequence" takes the sequence ratio exp(sum_t d_t), "geometric" the geometric mean
    exp(mean_t d_t), over the trajectory's trained tokens. aux (masked means over trained tokens):
    offpolicy_weight_mean, offpolicy_weight_max, tis_clip_fraction (the cap binds) and
    offpolicy_masked_fraction (tokens the sequence mask removed).
    """
    chex.assert_rank([old_logprobs, rollout_logprobs, mask, segment_ids], 2)
    chex.assert_equal_shape([old_logprobs, rollout_logprobs, mask, segment_ids])
    if sequence_mask not in SEQUENCE_MASKS:
        raise ValueError(f"sequence_mask {sequence_mask!r} is not one of {SEQUENCE_MASKS}")
    on_bt = mask > 0
    log_ratio_bt = jnp.where(on_bt, old_logprobs - rollout_logprobs, 0.0)
    log_ratio_bt = jax.lax.stop_gradient(jnp.clip(log_ratio_bt, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    ratio_bt = jnp.exp(log_ratio_bt)
    weight_bt = jnp.ones_like(ratio_bt) if tis_cap is None else jnp.minimum(ratio_bt, tis_cap)
    clipped_bt = jnp.zeros_like(on_bt) if tis_cap is None else on_bt & (ratio_bt > tis_cap)
    kept_bt = jnp.ones_like(on_bt)
    if sequence_mask != "none":
        b, t = segment_ids.shape
        key = (jnp.arange(b)[:, None] * t + segment_ids).reshape(-1)  # one id per (row, segment)
        seg_sum = lambda x: jax.ops.segment_sum(x.reshape(-1), key, num_segments=b * t)[key].reshape(b, t)
        log_seq = seg_sum(log_ratio_bt)
        if sequence_mask == "geometric":
            log_seq = log_seq / jnp.maximum(seg_sum(on_bt.astype(jnp.float32)), 1.0)
        bound = jnp.log(jnp.float32(mask_threshold))
        kept_bt = jnp.abs(log_seq) <= bound
    weight_bt = jnp.where(on_bt & kept_bt, weight_bt, 0.0)
    aux = {
        "offpolicy_weight_mean": _masked_mean(weight_bt, mask),
        "offpolicy_weight_max": jnp.max(jnp.where(on_bt, weight_bt, 0.0)),
        "tis_clip_fraction": _masked_mean(clipped_bt.astype(jnp.float32), mask),
        "offpolicy_masked_fraction": _masked_mean((~kept_bt).astype(jnp.float32), mask),
    }
    return weight_bt, aux


def sft_loss(
    logprobs: jax.Array, mask: jax.Array, *, num_tokens: jax.Array | float | None = None
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Masked mean negative log-likelihood: -sum(mask * logprobs) / N (N as in dapo_loss)."""
    chex.assert_rank([logprobs, mask], 2)
    chex.assert_equal_shape([logprobs, mask])
    chex.assert_type(logprobs, float)
    on_bt = mask > 0
    nll_sum = -jnp.sum(jnp.where(on_bt, logprobs * mask, 0.0))
    loss = nll_sum / _normalizer(mask, num_tokens)
    aux = {
        "nll": _masked_mean(-logprobs, mask),
        "num_tokens": jnp.sum(mask).astype(jnp.float32),
    }
    return loss, aux


def informative_groups(rewards: jax.Array) -> jax.Array:
    """bool [P]: True where a group's G rewards are not all equal (it carries a learning signal)."""
    chex.assert_rank(rewards, 2)
    return jnp.max(rewards, axis=-1) != jnp.min(rewards, axis=-1)


def group_advantages(rewards: jax.Array, *, eps: float = 1e-6, scale_by_std: bool = True) -> jax.Array:
    """[P, G] -> [P, G]: (r - mean_g) / (std_g + eps), population std; equal groups give exactly 0.
    With `scale_by_std` False, r - mean_g (Dr. GRPO, arXiv 2503.20783): the std division scales
    up lopsided groups (the lone failure of a 7-of-8 group gets -2.65 instead of -0.875)."""
    chex.assert_rank(rewards, 2)
    rewards = jnp.asarray(rewards, jnp.promote_types(rewards.dtype, jnp.float32))
    mean_p1 = jnp.mean(rewards, axis=-1, keepdims=True)
    adv = rewards - mean_p1
    if scale_by_std:
        adv = adv / (jnp.std(rewards, axis=-1, keepdims=True) + eps)
    return jnp.where(informative_groups(rewards)[:, None], adv, 0.0)


def turn_penalty(num_turns: jax.Array | int, *, threshold: int = 10, max_turns: int = 40) -> jax.Array:
    """R_len of the paper: 0 if n < threshold else (threshold - n) / (max_turns - threshold)."""
    if max_turns <= threshold:
        raise ValueError(f"max_turns ({max_turns}) must exceed threshold ({threshold})")
    n = jnp.asarray(num_turns, jnp.float32)
    return jnp.where(n < threshold, 0.0, (threshold - n) / float(max_turns - threshold))
