"""Per-token log-probs and entropies of packed rows, with optional context parallelism.

With a context axis of size n > 1, the rows go through the model in zigzag order (so causal
attention work is balanced over the devices that share a sequence); each position's next token is
put in the same order, the statistics are taken there, and only they are put back in order.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxswe.model.config import Qwen2Config
from jaxswe.model.logprobs import next_ids, next_token_stats, shift_right
from jaxswe.model.transformer import forward
from sharding import reorder_for_context, restore_order


def policy_logprobs(
    params,
    config: Qwen2Config,
    input_ids: jax.Array,
    positions: jax.Array,
    segment_ids: jax.Array,
    *,
    attention_fn=None,
    context_n: int = 1,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(log p(ids[t] | segment prefix), entropy, surprisal variance), each float32 [B, T]; 0 at each
    segment's first token and on padding (segment 0), like `jaxswe.model.token_logprobs`."""
    chex.assert_rank([input_ids, positions, segment_ids], 2)
    chex.assert_equal_shape([input_ids, positions, segment_ids])
    zig = lambda x: reorder_for_context(x, context_n)
    hidden = forward(
        params, config, zig(input_ids), zig(positions), zig(segment_ids), attention_fn=attention_fn
    )
    # the statistics are taken in zigzag order against the zigzagged next tokens, and only they
    # ([B, T] float32) are put back in order: the hidden states are never gathered whole
    grad_dtype = jnp.promote_types(config.grad_reduce_dtype, config.dtype)
    stats = next_token_stats(params, hidden, zig(next_ids(input_ids)), config.logprob_chunk, grad_dtype)
    stats = tuple(shift_right(restore_order(x, context_n)) for x in stats)
    continues = jnp.concatenate(
        [jnp.zeros_like(segment_ids[:, :1], bool), segment_ids[:, 1:] == segment_ids[:, :-1]], axis=1
    )
    keep = continues & (segment_ids != 0)
    return tuple(jnp.where(keep, x, 0.0) for x in stats)
