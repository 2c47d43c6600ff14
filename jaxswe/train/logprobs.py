"""Per-token log-probs and entropies of packed rows, with optional context parallelism.

With a context axis of size n > 1, the rows go through the model in zigzag order (so causal
attention work is balanced over the devices that share a sequence). The next-token targets are
put in the same zigzag order, so each context rank takes the log-probs of its own chunk of hidden
states (LM head and softmax on T/n tokens, chunk by chunk); only the [B, T] results go back to the
original order, never the [B, T, E] hidden states.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxswe.model.config import Qwen2Config
from jaxswe.model.logprobs import _chunk_stats
from jaxswe.model.transformer import forward
from sharding import constrain, reorder_for_context, restore_order


def policy_logprobs(
    params,
    config: Qwen2Config,
    input_ids: jax.Array,
    positions: jax.Array,
    segment_ids: jax.Array,
    *,
    attention_fn=None,
    context_n: int = 1,
) -> tuple[jax.Array, jax.Array]:
    """(log p(ids[t] | segment prefix), entropy), both float32 [B, T]; 0 at each segment's first
    token and on padding (segment 0), like `jaxswe.model.token_logprobs`."""
    chex.assert_rank([input_ids, positions, segment_ids], 2)
    chex.assert_equal_shape([input_ids, positions, segment_ids])
    zig = lambda x: reorder_for_context(x, context_n)
    hidden = forward(
        params, config, zig(input_ids), zig(positions), zig(segment_ids), attention_fn=attention_fn
    )
    next_ids = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1)
    stats = _local_next_token_stats(params, hidden, zig(next_ids), config.logprob_chunk, context_n)
    # stats[t] scores token t + 1 (from hidden state t): back to the original order, shift by one
    logp, entropy = (
        jnp.concatenate([jnp.zeros_like(x[:, :1]), restore_order(x, context_n)[:, :-1]], axis=1)
        for x in stats
    )
    continues = jnp.concatenate(
        [jnp.zeros_like(segment_ids[:, :1], bool), segment_ids[:, 1:] == segment_ids[:, :-1]], axis=1
    )
    keep = continues & (segment_ids != 0)
    return jnp.where(keep, logp, 0.0), jnp.where(keep, entropy, 0.0)


def _local_next_token_stats(params, hidden_bte, targets_bt, chunk: int, n: int):
    """(log p(targets[t] | hidden[t]), entropy), [B, T] float32, with T split into n context
    chunks that stay on their ranks: the scan runs over sub-chunks of every rank's chunk at once."""
    b, t, e = hidden_bte.shape
    local = t // n
    c = min(chunk, local)
    padded = -(-local // c) * c
    h = constrain(hidden_bte.reshape(b, n, local, e), ("batch", "length", None, "act_embed"))
    h = jnp.pad(h, ((0, 0), (0, 0), (0, padded - local), (0, 0)))
    tg = jnp.pad(targets_bt.reshape(b, n, local), ((0, 0), (0, 0), (0, padded - local)))
    h_k = jnp.moveaxis(h.reshape(b, n, padded // c, c, e), 2, 0)  # [K, B, n, c, E]
    tg_k = jnp.moveaxis(tg.reshape(b, n, padded // c, c), 2, 0)

    def step(xs):
        h_bnce, tg_bnc = xs
        lp, ent = _chunk_stats(params, h_bnce.reshape(b, n * c, e), tg_bnc.reshape(b, n * c))
        return lp.reshape(b, n, c), ent.reshape(b, n, c)

    lp, ent = jax.lax.map(jax.checkpoint(step, prevent_cse=False), (h_k, tg_k))
    back = lambda x: jnp.moveaxis(x, 0, 2).reshape(b, n, padded)[:, :, :local].reshape(b, t)
    return back(lp), back(ent)
