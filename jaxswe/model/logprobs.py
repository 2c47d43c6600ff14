"""Per-token log-probabilities (entropies, surprisal variances) of a causal LM's next tokens.

The vocabulary is walked in slabs (`sharding.vocab_stats`): about logprob_chunk x V float32 logits
exist at a time, in the forward and the backward pass, and no whole-vocabulary gradient.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from jaxswe.model.attention import AttentionFn
from jaxswe.model.config import Qwen2Config
from jaxswe.model.params import Params
from jaxswe.model.transformer import forward
from sharding.vocab import vocab_stats


def next_ids(input_ids: jnp.ndarray) -> jnp.ndarray:
    """ids[:, t + 1] at column t ([B, T]; the last column 0): what position t predicts."""
    return jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1)


def next_token_stats(params: Params, hidden_bte: jnp.ndarray, targets_bt: jnp.ndarray, chunk: int,
                     grad_dtype=jnp.float32) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:  # fmt: skip
    """(log p(targets[t] | hidden[t]), entropy, surprisal variance), each [B, T] float32
    (`sharding.vocab_stats`: about `chunk` x V logits at a time, the head's gradient formed in
    `grad_dtype` slab by slab)."""
    tied = "lm_head" not in params
    head = params["embed" if tied else "lm_head"]
    return vocab_stats(hidden_bte, head, targets_bt, chunk=chunk, tied=tied, grad_dtype=grad_dtype)


def shift_right(stats_bt: jnp.ndarray) -> jnp.ndarray:
    """Column t of the result is column t - 1 of `stats_bt` (the stats of token t); column 0 = 0."""
    return jnp.concatenate([jnp.zeros_like(stats_bt[:, :1]), stats_bt[:, :-1]], axis=1)


def hidden_logprobs(
    params: Params, hidden_bte: jnp.ndarray, input_ids: jnp.ndarray, chunk: int, grad_dtype=jnp.float32
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """(log p(ids[t] | hidden[t-1]), entropy of that distribution, variance of its surprisal), each
    [B, T] float32, column 0 = 0."""
    stats = next_token_stats(params, hidden_bte, next_ids(input_ids), chunk, grad_dtype)
    return tuple(shift_right(x) for x in stats)


def token_logprobs(
    params: Params,
    config: Qwen2Config,
    input_ids: jnp.ndarray,
    *,
    positions: jnp.ndarray | None = None,
    segment_ids: jnp.ndarray | None = None,
    attention_fn: AttentionFn | None = None,
    return_entropy: bool = False,
    return_variance: bool = False,
) -> jnp.ndarray | tuple[jnp.ndarray, ...]:
    """out[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) as float32 [B, T]; out[:, 0] = 0.

    With `segment_ids` (packed rows; 0 = padding) a token is conditioned only on its own segment,
    the first token of every segment and every padding token get 0. With `return_entropy`, also
    the entropy [B, T] of each predicted distribution (0 where the log-prob is 0 by definition);
    with `return_variance` too, the variance [B, T] of its surprisal -log p (what the sampling-bias
    check normalizes by).
    """
    chex.assert_rank(input_ids, 2)
    chex.assert_type(input_ids, int)
    hidden = forward(params, config, input_ids, positions, segment_ids, attention_fn=attention_fn)
    grad_dtype = jnp.promote_types(config.grad_reduce_dtype, config.dtype)
    stats = hidden_logprobs(params, hidden, input_ids, config.logprob_chunk, grad_dtype)
    if segment_ids is not None:
        chex.assert_equal_shape([input_ids, segment_ids])
        continues = jnp.concatenate(
            [jnp.zeros_like(segment_ids[:, :1], bool), segment_ids[:, 1:] == segment_ids[:, :-1]], axis=1
        )  # fmt: skip
        keep = continues & (segment_ids != 0)
        stats = tuple(jnp.where(keep, x, 0.0) for x in stats)
    chex.assert_shape(stats, input_ids.shape)
    if return_variance and not return_entropy:
        raise ValueError("return_variance needs return_entropy")
    return stats if return_variance else stats[:2] if return_entropy else stats[0]
