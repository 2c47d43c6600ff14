"""The sampling-bias alarm sees what log-prob gaps cannot: a real HTTP rollout server that applies
top-k on its side (whatever the request says, as an engine applying a model's generation_config
does) stops RL in its first iteration, before any update, while the rollout-vs-trainer log-prob
gap of the same tokens is ~0; unbiased sampling from the same model over the same server trips it
in none of 20 rounds."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import jax
import numpy as np
import pytest
from rl_toy_helpers import toy_config, toy_context, toy_policy

from jaxswe.model import save_hf
from jaxswe.rl.loop import rl_checkpoints, rl_trainer, train_rl
from jaxswe.rollout.bias import BiasAlarm, BiasedSamplingDetected, sampling_bias
from jaxswe.rollout.engine import EmbeddedEngine
from jaxswe.rollout.sampler import Sampler
from jaxswe.rollout.server import RolloutServer
from jaxswe.rollout.weights import load_model
from jaxswe.stages.context import StageBackend
from jaxswe.stages.rl import rl_inputs
from jaxswe.stages.runtime import make_backend

NV = 2


def _draws(rng, logits_nv, top_k=None):
    """One token per row from softmax(logits), optionally top-k truncated; (logp of it, entropy,
    surprisal variance) under the untruncated softmax."""
    logp = logits_nv - np.logaddexp.reduce(logits_nv, axis=-1, keepdims=True)
    p = np.exp(logp)
    ent = -(p * logp).sum(-1)
    var = (p * logp * logp).sum(-1) - ent * ent
    if top_k is not None:
        cut = np.sort(logp, axis=-1)[:, -top_k][:, None]
        p = np.where(logp >= cut, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    tokens = np.array([rng.choice(len(row), p=row) for row in p])
    return logp[np.arange(len(tokens)), tokens], ent, var


def test_statistic_is_centered_when_unbiased_and_positive_under_top_k():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(4000, 50))
    lp, ent, var = _draws(rng, logits)
    fair = sampling_bias(lp, ent, var, np.ones_like(lp))
    assert abs(fair["sampling_bias_z"]) < 4 and abs(fair["sampling_bias_nats"]) < 0.05
    assert fair["sampling_surprisal"] == pytest.approx(fair["sampling_entropy"], abs=0.05)
    # top-k 5 removes 0.4 nats/token here; top-k 20 removes 0.04 (z 2 in 4000 tokens)
    lp, ent, var = _draws(rng, logits, top_k=5)
    biased = sampling_bias(lp, ent, var, np.ones_like(lp))
    assert biased["sampling_bias_z"] > 10 and biased["sampling_bias_nats"] > 0.2
    assert BiasAlarm().fires(biased) and not BiasAlarm().fires(fair)
    empty = sampling_bias(lp, ent, var, np.zeros_like(lp))
    assert empty["sampling_bias_tokens"] == 0 and not BiasAlarm().fires(empty)


@pytest.mark.slow
def test_a_peaked_unbiased_policy_does_not_false_alarm():
    """A near-deterministic policy (top token 0.999, the rest of the mass in a 1000-token tail)
    sampled without bias, 400 tokens per iteration: most iterations draw no tail token, so every
    deficit is small and positive. Normalized by the observed deficits' spread that reads as
    z ~ sqrt(400) = 20 (the false alarm seen on trained toy and mined-task policies); normalized by
    the distribution's own surprisal variance it stays near 0. Top-k 1 on the same policy removes
    0.015 nats/token, too little to see in 400 tokens, and the alarm rightly stays quiet."""
    rng = np.random.default_rng(0)
    tail = np.log(1e-3 / 1000)
    logits = np.full((400, 1001), tail)
    logits[:, 0] = np.log(0.999)
    fired, z_old = 0, []
    for _ in range(200):
        lp, ent, var = _draws(rng, logits)
        stats = sampling_bias(lp, ent, var, np.ones_like(lp))
        fired += BiasAlarm().fires(stats)
        d = ent + lp
        z_old.append(d.mean() / (np.sqrt((d * d).sum()) / d.size))
    assert fired == 0
    assert np.mean(np.array(z_old) > 4) > 0.5  # the old normalizer would have fired on most of them


class ServerSideTopK(Sampler):
    """A sampler that applies top-k on the server whatever the request says; it still reports
    log-probs of the untruncated softmax, as SGLang does."""

    top_k = 2

    def generate(self, requests, **kwargs):
        forced = [
            dataclasses.replace(r, params=dataclasses.replace(r.params, top_k=self.top_k)) for r in requests
        ]
        return super().generate(forced, **kwargs)


class ServerThread:
    """A real `jaxswe serve` HTTP server (RolloutServer over an EmbeddedEngine) on its own loop,
    serving the policy saved as a Hugging Face dir and loaded as `jaxswe serve --model` does."""

    def __init__(self, sampler_cls: type[Sampler], policy, model_dir):
        save_hf(model_dir, policy.model_cfg, policy.params, dtype="float32")
        cfg, params = load_model(model_dir)
        # one prompt bucket (the whole 128-token context): a single compiled decode loop
        sampler = sampler_cls(cfg, params, max_context=128, min_batch_bucket=16, min_prompt_bucket=128)
        engine = EmbeddedEngine(sampler, load_fn=load_model, max_batch=16)
        self.server = RolloutServer(engine, "127.0.0.1", 0)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(60)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _peaked_policy(tmp_path):
    """The toy policy with its (tied) embedding scaled up, so next-token distributions are peaked
    like a trained model's (at random init they are near uniform, where no token is likelier than
    another and truncation cannot change the surprisal)."""
    policy, tok = toy_policy(tmp_path, NV, remat="none")
    params = dict(policy.params, embed=policy.params["embed"] * 3.0)  # mean entropy ~1 nat
    return dataclasses.replace(policy, params=params), tok


def _rl(tmp_path, name, policy, tok, server, iterations):
    cfg = toy_config(
        optimizer={"lr": 1e-6},
        mesh={"devices": 1},  # the RL loop, not sharding (tests/stages/test_stages_handoff.py)
        # float32 weight syncs: the unbiased run also checks the rollout-trainer gap (< 1e-4)
        rollout={"engine": "http", "urls": [server.url], "max_new_tokens": 2, "export_dtype": "float32"},
        rl={"iterations": iterations, "problems_per_iteration": 4, "group_size": 4, "rows_per_step": 8},
    )
    ctx = toy_context(cfg, tmp_path / name, policy, tok, NV)
    backend = StageBackend(cfg, policy, ctx.stage_dir, opened=make_backend(cfg, policy))
    ctx = dataclasses.replace(ctx, backend=backend)
    return rl_inputs(ctx, rl_trainer(cfg, policy), rl_checkpoints(ctx.stage_dir, resume=False))


@pytest.mark.slow
def test_server_side_top_k_stops_rl_in_its_first_iteration(tmp_path, capsys):
    policy, tok = _peaked_policy(tmp_path)
    server = ServerThread(ServerSideTopK, policy, tmp_path / "served")
    try:
        before = jax.device_get(policy.params)
        rl_run = _rl(tmp_path, "biased", policy, tok, server, iterations=3)
        with pytest.raises(BiasedSamplingDetected, match="rl iteration 1: BIASED SAMPLING") as info:
            train_rl(rl_run, resume=False)
    finally:
        server.stop()
    after = jax.device_get(rl_run.trainer.params)
    assert all(
        np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
    )
    assert not (rl_run.stage_dir / "checkpoints" / "1").exists()
    with capsys.disabled():
        print(f"\n{info.value}")
    gap_kl = float(str(info.value).split("log-prob gap KL is ")[1].split(",")[0])
    assert gap_kl < 1e-6  # the engine's untruncated log-probs: the gap alone sees nothing


@pytest.mark.slow
def test_unbiased_sampling_does_not_trip_in_20_rounds(tmp_path, capsys):
    """20 rounds of an RL iteration's collection and sampling check (the pump's take, then pack,
    recompute and check: `jaxswe.rl.train.prepare`; no update, so the statistic is the policy's)
    against the unbiased server: no false alarm, and the rollout-trainer gap stays under 1e-4."""
    from jaxswe.rl.problems import DataOrder
    from jaxswe.rl.pump import RolloutPump
    from jaxswe.rl.train import prepare

    policy, tok = _peaked_policy(tmp_path)
    server = ServerThread(Sampler, policy, tmp_path / "served")
    try:
        rl_run = _rl(tmp_path, "fair", policy, tok, server, iterations=20)
        pump = RolloutPump(rl_run, DataOrder())  # the server holds the policy's weights: no sync
        with asyncio.Runner() as runner:
            rows = [prepare(rl_run, runner.run(pump.take(step))[0], step)[2] for step in range(1, 21)]
            runner.run(pump.stop())
            runner.run(rl_run.backend.close())
    finally:
        server.stop()
    assert len(rows) == 20 and all(r["sampling_bias_tokens"] > 0 for r in rows)
    alarms = sum(r["sampling_bias_alarm"] for r in rows)
    zs = [r["sampling_bias_z"] for r in rows]
    with capsys.disabled():
        print(f"\nunbiased: {alarms}/{len(rows)} false alarms; z mean {np.mean(zs):.2f} sd {np.std(zs):.2f}")
    assert alarms == 0 and all(r["logprob_gap_max_abs"] < 1e-4 for r in rows)
