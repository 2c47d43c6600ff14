"""The embedded JAX sampler: batched prefill, KV cache and a jitted decode loop.

One call of `Sampler.generate` runs a batch of requests with per-row sampling parameters, stop
tokens and token budgets. Batch size, prompt length (at most to the context length) and decode
budget are padded up to powers of two, so a server sees a handful of compiled shapes. The decode
loop is a `lax.while_loop` that stops as soon as every row has finished, run in chunks so that
requests can be aborted between them. The model's EOS ids end every request that does not set
`ignore_eos` (as in SGLang).
Each row samples with its own key, a function of its request's `sampling_seed` and the token's
position only (`sampling.row_keys`); a request without a seed gets one from the sampler's seeded
stream. A row's numbers depend on the rest of its batch only through the padded shapes: XLA's CPU
matmuls round differently at another batch size or prompt bucket (~1e-6 in the log-probs, now and
then a different sampled token). At a fixed batch size (`min_batch_bucket` >= the batch) a batch of
requests with the same `shape_key` gives each row exactly the bits it gets alone, in any row.
Log-prob semantics: see `jaxswe.rollout.sampling`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxswe import model as M
from jaxswe.rollout.protocol import GenerateRequest, ProtocolError
from jaxswe.rollout.sampling import RowParams, row_keys, row_params, sample_tokens
from jaxswe.rollout.types import MAX_SEED, Generation


def bucket(n: int, minimum: int) -> int:
    """Smallest power of two >= max(n, minimum)."""
    n = max(n, minimum, 1)
    return 1 << (n - 1).bit_length()


class DecodeState(NamedTuple):
    """Everything the decode loop carries between steps (and between chunks)."""

    step: jax.Array  # int32 []
    tokens_bn: jax.Array  # int32 [B, N]
    logps_bn: jax.Array  # float32 [B, N]
    done_b: jax.Array  # bool [B]
    stopped_b: jax.Array  # bool [B]: ended on a stop token
    n_b: jax.Array  # int32 [B]: tokens generated
    logits_bv: jax.Array  # next-token logits
    cache: Any
    seeds_b2: jax.Array  # uint32 [B, 2]: each row's sampling seed (high, low 32 bits)
    lengths_b: jax.Array  # int32 [B]: prompt lengths (a token's position is length + step)


def _prefill(
    params: Any,
    ids_bt: jax.Array,
    lengths_b: jax.Array,
    max_new_b: jax.Array,
    seeds_b2: jax.Array,
    *,
    cfg: Any,
    n_max: int,
    cache_dtype: str,
) -> DecodeState:
    """Run the prompts and return the state before the first sampled token."""
    b, t = ids_bt.shape
    chex.assert_shape([lengths_b, max_new_b], (b,))
    cache = M.init_cache(cfg, b, t + n_max, cache_dtype)
    logits_bv, cache = M.prefill(params, cfg, ids_bt, lengths_b, cache)
    return DecodeState(
        step=jnp.int32(0),
        tokens_bn=jnp.zeros((b, n_max), jnp.int32),
        logps_bn=jnp.zeros((b, n_max), jnp.float32),
        done_b=max_new_b <= 0,  # max_new_tokens 0: nothing to sample
        stopped_b=jnp.zeros((b,), bool),
        n_b=jnp.zeros((b,), jnp.int32),
        logits_bv=logits_bv,
        cache=cache,
        seeds_b2=seeds_b2,
        lengths_b=lengths_b,
    )


def _decode_steps(
    params: Any,
    state: DecodeState,
    rp: RowParams,
    max_new_b: jax.Array,
    stop_bs: jax.Array,
    until: jax.Array,
    *,
    cfg: Any,
) -> DecodeState:
    """Sample until every row is done or `state.step` reaches `until` (the caller checks aborts
    between chunks)."""
    n_max = state.tokens_bn.shape[1]

    def cond(st: DecodeState):
        return (st.step < jnp.minimum(until, n_max)) & ~jnp.all(st.done_b)

    def body(st: DecodeState):
        keys_b = row_keys(st.seeds_b2, st.lengths_b + st.step)
        tok_b, lp_b = sample_tokens(keys_b, st.logits_bv, rp)
        active_b = ~st.done_b
        n_b = st.n_b + active_b.astype(jnp.int32)
        hit_stop_b = active_b & jnp.any(tok_b[:, None] == stop_bs, axis=-1)
        logits_bv, cache = M.decode_step(params, cfg, tok_b, st.cache)
        return DecodeState(
            step=st.step + 1,
            tokens_bn=st.tokens_bn.at[:, st.step].set(jnp.where(active_b, tok_b, 0)),
            logps_bn=st.logps_bn.at[:, st.step].set(jnp.where(active_b, lp_b, 0.0)),
            done_b=st.done_b | hit_stop_b | (n_b >= max_new_b),
            stopped_b=st.stopped_b | hit_stop_b,
            n_b=n_b,
            logits_bv=logits_bv,
            cache=cache,
            seeds_b2=st.seeds_b2,
            lengths_b=st.lengths_b,
        )

    return jax.lax.while_loop(cond, body, state)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _prompt_logprobs(params: Any, ids_bt: jax.Array, *, cfg: Any) -> jax.Array:
    return M.token_logprobs(params, cfg, ids_bt).astype(jnp.float32)


# Module-level jits: every Sampler of the same config (and a weight swap) reuses compiled code.
prefill = jax.jit(_prefill, static_argnames=("cfg", "n_max", "cache_dtype"))
decode_steps = jax.jit(_decode_steps, static_argnames=("cfg",), donate_argnames=("state",))


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
        eos_token_ids: tuple[int, ...] = (),
        decode_chunk: int = 32,
    ):
        self.seed = seed
        self.cache_dtype = str(cache_dtype)
        self.min_batch_bucket = min_batch_bucket
        self.min_prompt_bucket = min_prompt_bucket
        self.min_new_bucket = min_new_bucket
        self.min_stop_bucket = min_stop_bucket
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)  # stop every request (not ignore_eos)
        self.decode_chunk = max(1, int(decode_chunk))
        self._seeds = np.random.default_rng(seed)  # seeds for requests that bring none
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

    def stop_ids(self, req: GenerateRequest) -> tuple[int, ...]:
        """The ids that end `req`: its stop_token_ids and, unless `ignore_eos`, the model's EOS ids."""
        extra = (
            ()
            if req.ignore_eos
            else tuple(t for t in self.eos_token_ids if t not in req.params.stop_token_ids)
        )
        return (*req.params.stop_token_ids, *extra)

    def shape_key(self, req: GenerateRequest) -> tuple[int, int]:
        """(prompt bucket, budget bucket) of `req` alone: a batch whose requests share it runs at
        that padded prompt length and decode budget, which then depend on no other request. A
        prompt pads to the next power of two, at most to the context length."""
        budget = min(req.params.max_new_tokens, self.max_context - len(req.input_ids))
        prompt = min(bucket(len(req.input_ids), self.min_prompt_bucket), self.max_context)
        return prompt, bucket(budget, self.min_new_bucket)

    def generate(
        self, requests: list[GenerateRequest], *, aborted: Callable[[int], bool] | None = None
    ) -> list[Generation]:
        """Run one batch; each request keeps its own sampling parameters.

        Decoding runs in chunks of `decode_chunk` steps; between chunks, rows for which
        `aborted(i)` is true stop where they are and finish with "abort" (tokens so far kept).
        """
        for req in requests:
            self.validate(req)
        n = len(requests)
        b = bucket(n, self.min_batch_bucket)
        lengths = [len(r.input_ids) for r in requests]
        keys = [self.shape_key(r) for r in requests]
        t, n_max = max(k[0] for k in keys), max(k[1] for k in keys)
        budgets = [min(r.params.max_new_tokens, self.max_context - len(r.input_ids)) for r in requests]
        stops = [self.stop_ids(r) for r in requests]
        s = bucket(max(len(x) for x in stops), self.min_stop_bucket)

        ids_bt = np.zeros((b, t), np.int32)
        lengths_b = np.ones((b,), np.int32)
        max_new_b = np.ones((b,), np.int32)
        stop_bs = np.full((b, s), -1, np.int32)
        seeds_b2 = np.zeros((b, 2), np.uint32)
        temp, top_p, top_k, min_p = [1.0] * b, [1.0] * b, [-1] * b, [0.0] * b
        for i, r in enumerate(requests):
            ids_bt[i, : lengths[i]] = r.input_ids
            lengths_b[i] = lengths[i]
            max_new_b[i] = budgets[i]
            stop_bs[i, : len(stops[i])] = stops[i]
            p = r.params
            temp[i], top_p[i], top_k[i], min_p[i] = p.temperature, p.top_p, p.top_k, p.min_p
            seed = p.sampling_seed if p.sampling_seed is not None else int(self._seeds.integers(MAX_SEED))
            seeds_b2[i] = seed >> 32, seed & 0xFFFFFFFF
        max_new = jnp.asarray(max_new_b)
        state = prefill(
            self.params,
            jnp.asarray(ids_bt),
            jnp.asarray(lengths_b),
            max_new,
            jnp.asarray(seeds_b2),
            cfg=self.cfg,
            n_max=n_max,
            cache_dtype=self.cache_dtype,
        )
        rp, stop = row_params(temp, top_p, top_k, min_p), jnp.asarray(stop_bs)
        aborted_rows = np.zeros((b,), bool)
        while True:
            done_b, step = jax.device_get((state.done_b, state.step))
            if aborted is not None:
                newly = np.array([i < n and not done_b[i] and aborted(i) for i in range(b)])
                if newly.any():
                    aborted_rows |= newly
                    state = state._replace(done_b=state.done_b | jnp.asarray(newly))
                    done_b = done_b | newly
            if done_b.all() or step >= n_max:
                break
            until = jnp.int32(min(int(step) + self.decode_chunk, n_max))
            state = decode_steps(self.params, state, rp, max_new, stop, until, cfg=self.cfg)
        tokens_bn, logps_bn, n_b, stopped_b = jax.device_get(
            (state.tokens_bn, state.logps_bn, state.n_b, state.stopped_b)
        )
        prompt_lps = self._prompt_logprobs_for(requests, ids_bt[:n])

        gens = []
        for i in range(n):
            k = int(n_b[i])
            reason = "stop" if stopped_b[i] else "abort" if aborted_rows[i] else "length"
            gens.append(
                Generation(
                    output_ids=tokens_bn[i, :k].tolist(),
                    logprobs=logps_bn[i, :k].tolist(),
                    finish_reason=reason,
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
