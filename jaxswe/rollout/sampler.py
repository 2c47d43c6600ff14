"""The embedded JAX sampler: batched prefill, KV cache and a jitted decode loop.

One call of `Sampler.generate` runs a batch of requests with per-row sampling parameters, stop
tokens and token budgets. Batch size, prompt length and decode budget are padded up to powers of
two, so a server sees a handful of compiled shapes. The decode loop is a `lax.while_loop` that
stops as soon as every row has finished. Log-prob semantics: see `jaxswe.rollout.sampling`.
"""

from __future__ import annotations

import functools
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxswe import model as M
from jaxswe.rollout.protocol import GenerateRequest, ProtocolError
from jaxswe.rollout.sampling import RowParams, row_params, sample_tokens
from jaxswe.rollout.types import Generation


def bucket(n: int, minimum: int) -> int:
    """Smallest power of two >= max(n, minimum)."""
    n = max(n, minimum, 1)
    return 1 << (n - 1).bit_length()


def _decode_loop(
    params: Any,
    ids_bt: jax.Array,
    lengths_b: jax.Array,
    key: jax.Array,
    rp: RowParams,
    max_new_b: jax.Array,
    stop_bs: jax.Array,
    *,
    cfg: Any,
    n_max: int,
    cache_dtype: str,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Prefill, then sample until every row stopped or used its budget.

    Returns tokens_bn, logprobs_bn, num_generated_b, stopped_b (True: ended on a stop token).
    """
    b, t = ids_bt.shape
    chex.assert_shape([lengths_b, max_new_b], (b,))
    cache = M.init_cache(cfg, b, t + n_max, cache_dtype)
    logits_bv, cache = M.prefill(params, cfg, ids_bt, lengths_b, cache)

    def cond(state):
        step, _, _, done_b, *_ = state
        return (step < n_max) & ~jnp.all(done_b)

    def body(state):
        step, tokens_bn, logps_bn, done_b, stopped_b, n_b, logits_bv, cache, key = state
        key, sub = jax.random.split(key)
        tok_b, lp_b = sample_tokens(sub, logits_bv, rp)
        active_b = ~done_b
        tokens_bn = tokens_bn.at[:, step].set(jnp.where(active_b, tok_b, 0))
        logps_bn = logps_bn.at[:, step].set(jnp.where(active_b, lp_b, 0.0))
        n_b = n_b + active_b.astype(jnp.int32)
        hit_stop_b = active_b & jnp.any(tok_b[:, None] == stop_bs, axis=-1)
        stopped_b = stopped_b | hit_stop_b
        done_b = done_b | hit_stop_b | (n_b >= max_new_b)
        logits_bv, cache = M.decode_step(params, cfg, tok_b, cache)
        return step + 1, tokens_bn, logps_bn, done_b, stopped_b, n_b, logits_bv, cache, key

    init = (
        jnp.int32(0),
        jnp.zeros((b, n_max), jnp.int32),
        jnp.zeros((b, n_max), jnp.float32),
        jnp.zeros((b,), bool),
        jnp.zeros((b,), bool),
        jnp.zeros((b,), jnp.int32),
        logits_bv,
        cache,
        key,
    )
    _, tokens_bn, logps_bn, _, stopped_b, n_b, *_ = jax.lax.while_loop(cond, body, init)
    return tokens_bn, logps_bn, n_b, stopped_b


@functools.partial(jax.jit, static_argnames=("cfg",))
def _prompt_logprobs(params: Any, ids_bt: jax.Array, *, cfg: Any) -> jax.Array:
    return M.token_logprobs(params, cfg, ids_bt).astype(jnp.float32)


# Module-level jits: every Sampler of the same config (and a weight swap) reuses compiled code.
decode_loop = jax.jit(_decode_loop, static_argnames=("cfg", "n_max", "cache_dtype"))


class Sampler:
    """Holds one model's config and params and turns batches of requests into Generations."""

    def __init__(
        self,
        cfg: Any,
        params: Any,
        *,
        max_context: int | None = None,
        seed: int = 0,
        cache_dtype: str = "float32",
        min_batch_bucket: int = 1,
        min_prompt_bucket: int = 16,
        min_new_bucket: int = 16,
        min_stop_bucket: int = 4,
    ):
        self.seed = seed
        self.cache_dtype = str(cache_dtype)
        self.min_batch_bucket = min_batch_bucket
        self.min_prompt_bucket = min_prompt_bucket
        self.min_new_bucket = min_new_bucket
        self.min_stop_bucket = min_stop_bucket
        self._key = jax.random.PRNGKey(seed)
        self._max_context_arg = max_context
        self.swap(cfg, params)

    def swap(self, cfg: Any, params: Any) -> None:
        """Replace the model (callers make sure no batch is running)."""
        self.cfg, self.params = cfg, params
        self.vocab_size = int(cfg.vocab_size)
        self.max_context = int(self._max_context_arg or cfg.max_position_embeddings)

    def validate(self, req: GenerateRequest) -> None:
        """Raise ProtocolError for a request this model cannot serve."""
        if len(req.input_ids) >= self.max_context:
            raise ProtocolError(
                f"input has {len(req.input_ids)} tokens; the context length is {self.max_context}"
            )
        if any(not 0 <= t < self.vocab_size for t in req.input_ids):
            raise ProtocolError(f"input_ids: token id out of range [0, {self.vocab_size})")

    def generate(self, requests: list[GenerateRequest]) -> list[Generation]:
        """Run one batch; each request keeps its own sampling parameters."""
        for req in requests:
            self.validate(req)
        n = len(requests)
        b = bucket(n, self.min_batch_bucket)
        lengths = [len(r.input_ids) for r in requests]
        t = bucket(max(lengths), self.min_prompt_bucket)
        budgets = [min(r.params.max_new_tokens, self.max_context - len(r.input_ids)) for r in requests]
        n_max = bucket(max(budgets), self.min_new_bucket)
        s = bucket(max(len(r.params.stop_token_ids) for r in requests), self.min_stop_bucket)

        ids_bt = np.zeros((b, t), np.int32)
        lengths_b = np.ones((b,), np.int32)
        max_new_b = np.ones((b,), np.int32)
        stop_bs = np.full((b, s), -1, np.int32)
        temp, top_p, top_k, min_p = [1.0] * b, [1.0] * b, [-1] * b, [0.0] * b
        for i, r in enumerate(requests):
            ids_bt[i, : lengths[i]] = r.input_ids
            lengths_b[i] = lengths[i]
            max_new_b[i] = budgets[i]
            stop_bs[i, : len(r.params.stop_token_ids)] = r.params.stop_token_ids
            p = r.params
            temp[i], top_p[i], top_k[i], min_p[i] = p.temperature, p.top_p, p.top_k, p.min_p
        self._key, key = jax.random.split(self._key)
        out = decode_loop(
            self.params,
            jnp.asarray(ids_bt),
            jnp.asarray(lengths_b),
            key,
            row_params(temp, top_p, top_k, min_p),
            jnp.asarray(max_new_b),
            jnp.asarray(stop_bs),
            cfg=self.cfg,
            n_max=n_max,
            cache_dtype=self.cache_dtype,
        )
        tokens_bn, logps_bn, n_b, stopped_b = jax.device_get(out)
        prompt_lps = self._prompt_logprobs_for(requests, ids_bt[:n])

        gens = []
        for i in range(n):
            k = int(n_b[i])
            gens.append(
                Generation(
                    output_ids=tokens_bn[i, :k].tolist(),
                    logprobs=logps_bn[i, :k].tolist(),
                    finish_reason="stop" if stopped_b[i] else "length",
                    prompt_logprobs=prompt_lps.get(i),
                )
            )
        return gens

    def _prompt_logprobs_for(
        self, requests: list[GenerateRequest], ids_nt: np.ndarray
    ) -> dict[int, list[float]]:
        rows = [i for i, r in enumerate(requests) if r.return_logprob and r.logprob_start_len >= 0]
        if not rows:
            return {}
        b = bucket(len(rows), self.min_batch_bucket)
        batch_bt = np.zeros((b, ids_nt.shape[1]), np.int32)
        batch_bt[: len(rows)] = ids_nt[rows]
        lps_bt = np.asarray(
            jax.device_get(_prompt_logprobs(self.params, jnp.asarray(batch_bt), cfg=self.cfg))
        )
        out = {}
        for j, i in enumerate(rows):
            r = requests[i]
            out[i] = lps_bt[j, r.logprob_start_len : len(r.input_ids)].tolist()
        return out
