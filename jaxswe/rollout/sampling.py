"""Sampling math for the embedded sampler: pure, jit-able, one set of parameters per batch row.

Which distribution the returned log-probs belong to (decided to match SGLang's default, i.e.
without SGLANG_RETURN_ORIGINAL_LOGPROB): a sampled token's log-prob is taken under the
temperature-scaled but UNTRUNCATED distribution, `log_softmax(logits / temperature)`; top-k,
top-p and min-p only choose which tokens can be drawn. At temperature 0 (greedy) the log-prob is
under `log_softmax(logits)`. For RL (temperature 1, no truncation) the sampled distribution and
the reported log-probs are exactly the model's softmax, which is what the trainer recomputes.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf


@chex.dataclass(frozen=True)
class RowParams:
    """Per-row sampling parameters as arrays of shape [B] (top_k <= 0 means off)."""

    temperature_b: chex.Array  # float32; 0 means greedy
    top_p_b: chex.Array  # float32 in (0, 1]
    top_k_b: chex.Array  # int32
    min_p_b: chex.Array  # float32 in [0, 1]


def row_params(temperature, top_p, top_k, min_p) -> RowParams:
    """Build RowParams from sequences (one value per row)."""
    return RowParams(
        temperature_b=jnp.asarray(temperature, jnp.float32),
        top_p_b=jnp.asarray(top_p, jnp.float32),
        top_k_b=jnp.asarray(top_k, jnp.int32),
        min_p_b=jnp.asarray(min_p, jnp.float32),
    )


def scaled_logits(logits_bv: jax.Array, temperature_b: jax.Array) -> jax.Array:
    """float32 logits divided by each row's temperature (rows at temperature 0 are left unscaled)."""
    logits_bv = logits_bv.astype(jnp.float32)
    safe_t = jnp.where(temperature_b > 0, temperature_b, 1.0)
    return logits_bv / safe_t[:, None]


def truncation_mask(logprobs_bv: jax.Array, rp: RowParams) -> jax.Array:
    """Bool [B, V]: tokens top-k, top-p and min-p (each per row) leave eligible.

    `logprobs_bv` are the temperature-scaled log-probs. Ties at a threshold are kept together, so a
    mask never removes the most likely token.
    """
    chex.assert_rank(logprobs_bv, 2)
    vocab = logprobs_bv.shape[-1]
    sorted_bv = jnp.sort(logprobs_bv, axis=-1)[:, ::-1]  # descending
    # top-k: the k-th largest value is the threshold.
    k_b = jnp.where(rp.top_k_b > 0, jnp.minimum(rp.top_k_b, vocab), vocab)
    kth_b = jnp.take_along_axis(sorted_bv, (k_b - 1)[:, None], axis=-1)[:, 0]
    # top-p: keep the smallest prefix whose mass reaches top_p (the token crossing it included).
    probs_sorted_bv = jnp.exp(sorted_bv)
    mass_before_bv = jnp.cumsum(probs_sorted_bv, axis=-1) - probs_sorted_bv
    n_keep_b = jnp.maximum(jnp.sum(mass_before_bv < rp.top_p_b[:, None], axis=-1), 1)
    pth_b = jnp.take_along_axis(sorted_bv, (n_keep_b - 1)[:, None], axis=-1)[:, 0]
    # min-p: p >= min_p * p_max.
    mth_b = sorted_bv[:, 0] + jnp.log(jnp.maximum(rp.min_p_b, 1e-38))
    mth_b = jnp.where(rp.min_p_b > 0, mth_b, _NEG_INF)
    threshold_b = jnp.maximum(jnp.maximum(kth_b, pth_b), mth_b)
    return logprobs_bv >= threshold_b[:, None]


def needs_truncation(rp: RowParams) -> jax.Array:
    """Scalar bool: does any row ask for top-k, top-p or min-p?"""
    return jnp.any((rp.top_k_b > 0) | (rp.top_p_b < 1.0) | (rp.min_p_b > 0.0))


def row_keys(seeds_b2: jax.Array, positions_b: jax.Array) -> jax.Array:
    """One PRNG key per row from its seed (uint32 [B, 2]: high and low 32 bits) and the position of
    the token it samples: a row's draw depends on nothing else (not its batch, not its row)."""
    chex.assert_shape(seeds_b2, (positions_b.shape[0], 2))

    def one(seed_2: jax.Array, position: jax.Array) -> jax.Array:
        seed_key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), seed_2[0]), seed_2[1])
        return jax.random.fold_in(seed_key, position)

    return jax.vmap(one)(seeds_b2.astype(jnp.uint32), positions_b.astype(jnp.uint32))


def sample_tokens(keys_b: jax.Array, logits_bv: jax.Array, rp: RowParams) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row, row i with `keys_b[i]`; returns (tokens_b int32, logprobs_b float32).

    Log-probs are under the temperature-scaled, untruncated distribution (see module docstring).
    The vocabulary sort for truncation runs only when some row asks for it.
    """
    chex.assert_rank(logits_bv, 2)
    chex.assert_shape(rp.temperature_b, (logits_bv.shape[0],))
    logprobs_bv = jax.nn.log_softmax(scaled_logits(logits_bv, rp.temperature_b), axis=-1)
    eligible_bv = jax.lax.cond(
        needs_truncation(rp),
        lambda lp: truncation_mask(lp, rp),
        lambda lp: jnp.ones(lp.shape, bool),
        logprobs_bv,
    )
    masked_bv = jnp.where(eligible_bv, logprobs_bv, _NEG_INF)
    drawn_b = jax.vmap(jax.random.categorical)(keys_b, masked_bv)
    greedy_b = jnp.argmax(logprobs_bv, axis=-1)
    tokens_b = jnp.where(rp.temperature_b > 0, drawn_b, greedy_b).astype(jnp.int32)
    picked_b = jnp.take_along_axis(logprobs_bv, tokens_b[:, None], axis=-1)[:, 0]
    chex.assert_shape(tokens_b, (logits_bv.shape[0],))
    return tokens_b, picked_b
