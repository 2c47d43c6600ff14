"""Per-token log-probabilities (entropies, surprisal variances) computed chunk by chunk over the sequence.

Only [B, logprob_chunk, V] float32 logits exist at a time, in the forward and (thanks to a
rematerialized chunk step) in the backward pass.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxswe.model.attention import AttentionFn
from jaxswe.model.config import Qwen2Config
from jaxswe.model.params import Params
from jaxswe.model.transformer import forward, project_vocab


def _chunk_stats(params: Params, hidden_bce: jnp.ndarray, targets_bc: jnp.ndarray):
    """log p(target), entropy and the variance of the surprisal -log p(x) under p, each [B, C],
    for one chunk of hidden states."""
    logits_bcv = project_vocab(params, hidden_bce)
    logp_bcv = jax.nn.log_softmax(logits_bcv, axis=-1)
    target_logp = jnp.take_along_axis(logp_bcv, targets_bc[..., None], axis=-1)[..., 0]
    p_bcv = jnp.exp(logp_bcv)
    entropy = -jnp.sum(p_bcv * logp_bcv, axis=-1)
    surprisal_var = jnp.maximum(jnp.sum(p_bcv * logp_bcv * logp_bcv, axis=-1) - entropy * entropy, 0.0)
    return target_logp, entropy, surprisal_var


def hidden_logprobs(
    params: Params, hidden_bte: jnp.ndarray, input_ids: jnp.ndarray, chunk: int
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """(log p(ids[t] | hidden[t-1]), entropy of that distribution, variance of its surprisal), each
    [B, T] float32, column 0 = 0. Callers that do not use the variance leave it to XLA's DCE."""
    b, t = input_ids.shape
    n = t - 1
    if n == 0:
        zeros = jnp.zeros((b, t), jnp.float32)
        return zeros, zeros, zeros
    c = min(chunk, n)
    padded = -(-n // c) * c
    hidden = jnp.pad(hidden_bte[:, :-1], ((0, 0), (0, padded - n), (0, 0)))
    targets = jnp.pad(input_ids[:, 1:], ((0, 0), (0, padded - n)))
    hidden_chunks = jnp.moveaxis(hidden.reshape(b, padded // c, c, -1), 1, 0)
    target_chunks = jnp.moveaxis(targets.reshape(b, padded // c, c), 1, 0)
    step = jax.checkpoint(lambda xs: _chunk_stats(params, *xs), prevent_cse=False)
    stats = jax.lax.map(step, (hidden_chunks, target_chunks))

    def assemble(x_nbc):
        x = jnp.moveaxis(x_nbc, 0, 1).reshape(b, padded)[:, :n]
        return jnp.concatenate([jnp.zeros((b, 1), jnp.float32), x], axis=1)

    return tuple(assemble(x) for x in stats)


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
    stats = hidden_logprobs(params, hidden, input_ids, config.logprob_chunk)
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
