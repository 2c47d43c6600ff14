"""Same seed, same tokens: a seeded request's tokens depend on its seed and positions only, not on
the batch it shares, its row, the decode chunking or the server; the agent loop gives every
episode and turn its own seed, independent of the order and concurrency of episodes."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs.base import Step
from jaxswe.agent.loop import episode_seeds, run_episodes
from jaxswe.model.config import get_preset
from jaxswe.model.params import init_params
from jaxswe.rollout.client import RolloutClient
from jaxswe.rollout.engine import EmbeddedEngine
from jaxswe.rollout.protocol import (
    GenerateRequest,
    ProtocolError,
    sampling_params_from_json,
    sampling_params_to_json,
)
from jaxswe.rollout.sampler import Sampler
from jaxswe.rollout.server import RolloutServer
from jaxswe.rollout.types import SamplingParams
from jaxswe.tokenizer import build_tokenizer

PROMPT = [3, 17, 42, 8, 8, 1, 60, 25, 11]
SEEDED = SamplingParams(max_new_tokens=40, sampling_seed=2**40 + 123)  # above 32 bits
BUCKETS = {"min_new_bucket": 64}  # every batch below compiles one of two shapes: (1, 16, 64), (4, 32, 64)
CORPUS = ["task a b ok Reply with one command.\n```\nls\n```\n"] * 20


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(CORPUS, 300)


@pytest.fixture(scope="module")
def model(tok):
    cfg = get_preset("tiny", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, max_position_embeddings=512)  # fmt: skip
    rng = np.random.default_rng(0)  # random weights without compiling the initializer
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    return cfg, jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.3, x.shape), x.dtype), shapes)


@pytest.fixture(scope="module")
def alone(model):
    return Sampler(*model, **BUCKETS).generate([_req()])[0]


def _req(params=SEEDED, ids=PROMPT):
    return GenerateRequest(list(ids), params, ignore_eos=True)


def _others():
    return [
        _req(SamplingParams(max_new_tokens=60, sampling_seed=5), range(1, 30)),  # longer prompt and budget
        _req(SamplingParams(max_new_tokens=3)),  # unseeded
        _req(SamplingParams(max_new_tokens=40, temperature=0.7, top_k=5, sampling_seed=9)),
    ]


def _seeded(gens, batch):
    return [g for g, r in zip(gens, batch, strict=True) if r.params == SEEDED]


@pytest.mark.slow
def test_seeded_request_same_tokens_alone_or_in_any_batch(model, alone):
    assert len(alone.output_ids) == 40
    others = _others()
    for i, batch in enumerate(([*others, _req()], [_req(), *others], [others[0], _req(), others[2], _req()])):
        sampler = Sampler(*model, seed=i, decode_chunk=7 + 10 * i, **BUCKETS)  # other server seeds, chunks
        for got in _seeded(sampler.generate(batch), batch):
            assert got.output_ids == alone.output_ids
            # the batch's shapes (padding, cache length) move the float32 logits by ~1e-6, no more
            np.testing.assert_allclose(got.logprobs, alone.logprobs, atol=1e-5)
    # another seed: other tokens; unseeded requests draw from the sampler's stream: two differ;
    # keys are per absolute position, so a request resumed from its own partial output with the
    # same seed (a partial rollout continued, same weights here) goes on exactly
    k = 15
    batch = [
        _req(SamplingParams(max_new_tokens=40, sampling_seed=124)),
        _req(SamplingParams(max_new_tokens=40)),
        _req(SamplingParams(max_new_tokens=40)),
        _req(
            SamplingParams(max_new_tokens=40 - k, sampling_seed=SEEDED.sampling_seed),
            PROMPT + alone.output_ids[:k],
        ),
    ]
    other, free_a, free_b, rest = (g.output_ids for g in Sampler(*model, **BUCKETS).generate(batch))
    assert other != alone.output_ids and free_a != free_b
    assert rest == alone.output_ids[k:]


def test_sampling_seed_on_the_wire():
    params = SamplingParams(max_new_tokens=4, sampling_seed=7)
    assert sampling_params_to_json(params)["sampling_seed"] == 7
    assert sampling_params_from_json({"max_new_tokens": 4, "sampling_seed": 7}) == params
    assert sampling_params_from_json({"sampling_seed": None}).sampling_seed is None
    for bad in (-1, 2**63, "7", 1.5, True):
        with pytest.raises(ProtocolError, match="sampling_seed"):
            sampling_params_from_json({"sampling_seed": bad})


def test_seeded_requests_over_http_match_the_sampler_whatever_runs_beside_them(model, alone):
    async def main():
        sampler = Sampler(*model, seed=3, min_batch_bucket=4, min_prompt_bucket=32, **BUCKETS)
        engine = EmbeddedEngine(sampler, max_batch=4, batch_wait_s=0.05)
        server = RolloutServer(engine, port=0)
        url = await server.start()
        try:
            async with RolloutClient(url) as client:
                runs = []
                for first in (True, False):  # the seeded request first or last among concurrent ones
                    calls = [client.generate(r.input_ids, r.params) for r in _others() if r.params.unbiased]
                    seeded = client.generate(PROMPT, SEEDED)
                    gens = await asyncio.gather(*([seeded, *calls] if first else [*calls, seeded]))
                    runs.append(gens[0 if first else -1].output_ids)
                return runs, engine.batches_run
        finally:
            await server.stop()

    runs, batches = asyncio.run(main())
    assert batches <= 4  # the requests really shared batches
    assert runs == [alone.output_ids, alone.output_ids]


class _EchoTask:
    """An environment that accepts every action (episodes run to max_turns)."""

    system_prompt = "Reply with one command."

    def __init__(self, task_id):
        self.task_id = task_id

    def reset(self):
        return f"task {self.task_id}"

    def step(self, action_text):
        return Step("ok")

    def reward(self):
        return 0.0

    def close(self):
        pass


@pytest.mark.slow
def test_episodes_keep_their_tokens_whatever_order_and_concurrency(model, tok):
    sampling = SamplingParams(max_new_tokens=12, sampling_seed=11)

    def play(task_ids, concurrency):
        async def main():
            buckets = {"min_batch_bucket": 4, "min_prompt_bucket": 256, "min_new_bucket": 16}  # one shape
            engine = EmbeddedEngine(Sampler(*model, seed=concurrency, **buckets), max_batch=4)
            try:
                envs = [_EchoTask(t) for t in task_ids]
                limits = {"max_turns": 3, "max_context_tokens": 200, "concurrency": concurrency}
                return await run_episodes(envs, engine, tok, sampling=sampling, **limits)
            finally:
                await engine.close()

        return [t.input_ids for t in asyncio.run(main())]

    a0, b0, a1 = play(["a", "b", "a"], concurrency=3)
    b0_, a0_, a1_ = play(["b", "a", "a"], concurrency=1)
    assert (a0, b0, a1) == (a0_, b0_, a1_)
    assert a0 != a1  # two samples of one task get their own seeds
    seeds = episode_seeds(["a", "b", "a"], 11)
    assert len(set(seeds)) == 3 and episode_seeds(["b", "a", "a"], 11) == [seeds[1], seeds[0], seeds[2]]
    assert episode_seeds(["a"], None) == [None]


@pytest.mark.slow
def test_batch_invariant_engine_gives_each_request_its_bits_alone(model):
    """With batch_invariant, requests of two prompt buckets submitted together run as one batch per
    bucket at the fixed batch size, and each gets exactly (every bit of every log-prob) what it gets
    alone; without it a short prompt shares the long one's padding, which moves its log-probs."""
    short = [_req(SamplingParams(max_new_tokens=20, sampling_seed=s), range(1, 9 + s)) for s in range(3)]
    long = [_req(SamplingParams(max_new_tokens=20, sampling_seed=9 + s), range(1, 20 + s)) for s in range(2)]

    def run(requests):
        async def main():
            sampler = Sampler(*model, min_batch_bucket=4, **BUCKETS)
            engine = EmbeddedEngine(sampler, max_batch=4, batch_wait_s=0.05, batch_invariant=True)
            try:
                return [g for g, _ in await engine.submit(requests)], engine.batches_run
            finally:
                await engine.close()

        return asyncio.run(main())

    together, batches = run([*long, *short])
    assert batches == 2  # one batch per prompt bucket (16 and 32 tokens)
    alone = [run([r])[0][0] for r in [*long, *short]]
    assert [(g.output_ids, g.logprobs) for g in together] == [(g.output_ids, g.logprobs) for g in alone]
    with pytest.raises(ValueError, match="min_batch_bucket 1 < max_batch 4"):
        EmbeddedEngine(Sampler(*model), max_batch=4, batch_invariant=True)


@pytest.mark.slow
def test_prompt_pads_to_a_power_of_two_at_most_the_context(model):
    sampler = Sampler(*model, max_context=40, **BUCKETS)
    assert sampler.shape_key(_req(ids=range(1, 21))) == (32, 64)
    long = _req(SamplingParams(max_new_tokens=40, sampling_seed=1), range(1, 36))
    assert sampler.shape_key(long) == (40, 64)  # not 64: the prompt and its budget fill the context
    assert len(sampler.generate([long])[0].output_ids) == 5
