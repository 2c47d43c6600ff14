"""Per-token log-probabilities (and entropies) computed chunk by chunk over the sequence.

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
from sharding.logical import constrain


def _chunk_stats(params: Params, hidden_bce: jnp.ndarray, targets_bc: jnp.ndarray):
    """log p(target) and entropy [B, C] for one chunk of hidden states."""
    logits_bcv = project_vocab(params, hidden_bce)
    logp_bcv = jax.nn.log_softmax(logits_bcv, axis=-1)
    target_logp = jnp.take_along_axis(logp_bcv, targets_bc[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_bcv) * logp_bcv, axis=-1)
    return target_logp, entropy


def next_token_stats(
    params: Params, hidden_bte: jnp.ndarray, targets_bt: jnp.ndarray, chunk: int, groups: int = 1
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(log p(targets[t] | hidden[t]), entropy of that distribution), both [B, T] float32.

    The sequence is cut into `groups` equal contiguous parts, and each step of the chunk loop takes
    one chunk of every part: with groups = the context size and the sequence sharded over the
    context axis, every device projects only its own tokens onto the vocabulary.
    """
    b, t = targets_bt.shape
    chex.assert_shape(hidden_bte, (b, t, None))
    if t % groups:
        raise ValueError(f"next_token_stats: length {t} is not a multiple of {groups} groups")
    part = t // groups
    c = min(chunk, part)
    n = -(-part // c)

    def split(x):  # [B, T, ...] -> [n, B, groups, c, ...]: one chunk of every part per step
        x = x.reshape(b, groups, part, *x.shape[2:])
        x = jnp.pad(x, ((0, 0), (0, 0), (0, n * c - part)) + ((0, 0),) * (x.ndim - 3))
        return jnp.moveaxis(x.reshape(b, groups, n, c, *x.shape[3:]), 2, 0)

    def step(xs):
        h_bgce, y_bgc = xs
        h = constrain(h_bgce.reshape(b, groups * c, -1), ("batch", "length", "act_embed"))
        return _chunk_stats(params, h, y_bgc.reshape(b, groups * c))

    stats = jax.lax.map(jax.checkpoint(step, prevent_cse=False), (split(hidden_bte), split(targets_bt)))

    def assemble(x_nbx):  # [n, B, groups * c] -> [B, T]
        x = jnp.moveaxis(x_nbx.reshape(n, b, groups, c), 0, 2).reshape(b, groups, n * c)
        return x[:, :, :part].reshape(b, t)

    return assemble(stats[0]), assemble(stats[1])


def shift_right(x_bt: jnp.ndarray) -> jnp.ndarray:
    """out[:, t] = x[:, t - 1], out[:, 0] = 0: next-token stats of t-1 become the stats of token t."""
    return jnp.concatenate([jnp.zeros_like(x_bt[:, :1]), x_bt[:, :-1]], axis=1)


def hidden_logprobs(
    params: Params, hidden_bte: jnp.ndarray, input_ids: jnp.ndarray, chunk: int
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(log p(ids[t] | hidden[t-1]), entropy of that distribution), both [B, T] float32, column 0 = 0."""
    if input_ids.shape[1] == 1:
        zeros = jnp.zeros(input_ids.shape, jnp.float32)
        return zeros, zeros
    logp, entropy = next_token_stats(params, hidden_bte[:, :-1], input_ids[:, 1:], chunk)
    return shift_right(logp), shift_right(entropy)


def token_logprobs(
    params: Params,
    config: Qwen2Config,
    input_ids: jnp.ndarray,
    *,
    positions: jnp.ndarray | None = None,
    segment_ids: jnp.ndarray | None = None,
    attention_fn: AttentionFn | None = None,
    return_entropy: bool = False,
) -> jnp.ndarray | tuple[jnp.ndarray, jnp.ndarray]:
    """out[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) as float32 [B, T]; out[:, 0] = 0.

    With `segment_ids` (packed rows; 0 = padding) a token is conditioned only on its own segment,
    the first token of every segment and every padding token get 0. With `return_entropy`, also
    the entropy [B, T] of each predicted distribution (0 where the log-prob is 0 by definition).
    """
    chex.assert_rank(input_ids, 2)
    chex.assert_type(input_ids, int)
    hidden = forward(params, config, input_ids, positions, segment_ids, attention_fn=attention_fn)
    logp, entropy = hidden_logprobs(params, hidden, input_ids, config.logprob_chunk)
    if segment_ids is not None:
        chex.assert_equal_shape([input_ids, segment_ids])
        continues = jnp.concatenate(
            [jnp.zeros_like(segment_ids[:, :1], bool), segment_ids[:, 1:] == segment_ids[:, :-1]], axis=1
        )  # fmt: skip
        keep = continues & (segment_ids != 0)
        logp, entropy = jnp.where(keep, logp, 0.0), jnp.where(keep, entropy, 0.0)
    chex.assert_shape(logp, input_ids.shape)
    return (logp, entropy) if return_entropy else logp
