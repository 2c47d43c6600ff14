"""`jaxswe serve` control protocol (SGLang 0.5.x) over real HTTP: pause/continue/abort, weight
updates with versions, EOS ids, and a weight update in the middle of an agent episode whose
tokens then carry the version that sampled them."""

import asyncio
import json
import threading
import urllib.request
from dataclasses import replace

import jax.numpy as jnp
import numpy as np
import pytest
from rl_toy_helpers import toy_tokenizer
from test_serve import PROMPT, _post, _ThreadServer, _tiny_hf

from envs.base import Step
from jaxswe import model as M
from jaxswe.agent.loop import run_episode
from jaxswe.cli.serve import eos_token_ids
from jaxswe.errors import UserError
from jaxswe.rollout.client import RequestAborted, RolloutClient
from jaxswe.rollout.engine import EmbeddedEngine
from jaxswe.rollout.sampler import Sampler
from jaxswe.rollout.types import SamplingParams
from jaxswe.rollout.weights import load_model

CHUNK = 2  # decode steps between abort checks


class GatedSampler(Sampler):
    """A Sampler whose armed batch stops after `after` decode chunks until the test releases it,
    so a pause or update lands in the middle of a generation every time."""

    def __init__(self, *args, after=2, arm_at_call=None, **kwargs):
        super().__init__(*args, decode_chunk=CHUNK, **kwargs)
        self.after, self.arm_at_call, self.calls = after, arm_at_call, 0
        self.armed = threading.Event()
        self.reached = threading.Event()
        self.release = threading.Event()

    def generate(self, requests, *, aborted=None):
        self.calls += 1
        if self.calls == self.arm_at_call:
            self.armed.set()
        if not self.armed.is_set():
            return super().generate(requests, aborted=aborted)
        self.armed.clear()
        checks = iter(range(1 << 30))

        def gated(i):
            if next(checks) == self.after:
                self.reached.set()
                assert self.release.wait(60)
            return aborted(i)

        return super().generate(requests, aborted=gated)


def _gated_server(path, **kw):
    cfg, params = load_model(path)
    sampler = GatedSampler(cfg, params, seed=0, **kw)
    return _ThreadServer(EmbeddedEngine(sampler, load_fn=load_model, model_path=str(path), max_batch=4))


def _in_thread(fn, *args):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("v", fn(*args)), daemon=True)
    t.start()
    return t, out


def _gen(url, **kw):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 40}, "return_logprob": True, **kw}
    return _post(url, "/generate", body)


def _get(url, path):
    with urllib.request.urlopen(url + path, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: (root / name, _tiny_hf(root / name, seed)) for name, seed in (("a", 0), ("b", 1))}


def _trainer_logprobs(path, ids, pad_to=128):
    """token_logprobs of `ids`, padded to one length (causal: padding leaves them unchanged), so
    every call compiles once."""
    cfg, params = load_model(path)
    padded = jnp.asarray([list(ids) + [0] * (pad_to - len(ids))])
    return np.asarray(M.token_logprobs(params, cfg, padded))[0, : len(ids)]


def test_eos_ids_come_from_config_and_generation_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 5}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 5]}))
    assert eos_token_ids(tmp_path) == (5, 7)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(UserError, match="generation_config.json: eos_token_id"):
        eos_token_ids(tmp_path)
    assert eos_token_ids(tmp_path / "missing") == ()


@pytest.mark.slow
def test_eos_ignore_eos_rid_zero_tokens_and_info_routes(models):
    path = models["a"][0]
    cfg, params = load_model(path)
    plain = Sampler(cfg, params, seed=0)
    srv = _ThreadServer(EmbeddedEngine(plain, model_path=str(path), weight_version="7"))
    try:
        greedy = {"max_new_tokens": 8, "temperature": 0.0}
        ids = _gen(srv.url, sampling_params=greedy)[1]["output_ids"]
        eos = next(t for t in ids[2:] if t not in ids[:2])
        plain.eos_token_ids = (eos,)
        status, out = _gen(srv.url, sampling_params=greedy, rid="req-1")
        assert status == 200 and out["output_ids"] == ids[: ids.index(eos) + 1]
        meta = out["meta_info"]
        assert meta["finish_reason"] == {"type": "stop", "matched": eos}
        assert meta["id"] == "req-1" and meta["weight_version"] == "7"
        out = _gen(srv.url, sampling_params={**greedy, "ignore_eos": True})[1]
        assert out["output_ids"] == ids and out["meta_info"]["finish_reason"]["type"] == "length"
        status, out = _gen(srv.url, sampling_params={"max_new_tokens": 0}, logprob_start_len=0)
        assert status == 200 and out["output_ids"] == []
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        assert [e[1] for e in out["meta_info"]["input_token_logprobs"]] == PROMPT
        status, err = _gen(srv.url, input_ids=[PROMPT, PROMPT], rid=["x", "x"])
        assert status == 400 and "duplicate" in err["error"]["message"]
        status, err = _gen(srv.url, sampling_params={"ignore_eos": 1})
        assert status == 400 and "ignore_eos" in err["error"]["message"]
        for route in ("/model_info", "/get_model_info"):
            info = _get(srv.url, route)
            assert info["model_path"] == str(path) and info["weight_version"] == "7"
            assert info["eos_token_ids"] == [eos]
        for route in ("/server_info", "/get_server_info"):
            assert _get(srv.url, route)["internal_states"] == [{"paused": False, "num_in_flight": 0}]
        assert _get(srv.url, "/get_weight_version") == {"weight_version": "7"}
    finally:
        srv.close()


@pytest.mark.slow
def test_pause_aborts_in_flight_holds_new_requests_and_update_applies_at_once(models):
    srv = _gated_server(models["a"][0])
    sampler = srv.engine.sampler
    try:
        sampler.armed.set()
        running, first = _in_thread(_gen, srv.url)
        assert sampler.reached.wait(60)
        assert _post(srv.url, "/flush_cache", {})[0] == 400  # SGLang: not while requests run
        pausing, paused = _in_thread(_post, srv.url, "/pause_generation", {"mode": "abort"})
        pausing.join(0.5)
        assert pausing.is_alive()  # SGLang: the pause returns once the aborted requests have
        sampler.release.set()
        running.join(60)
        pausing.join(60)
        assert paused["v"] == (200, {"message": "Generation paused successfully.", "status": "ok"})
        status, out = first["v"]
        meta = out["meta_info"]
        assert status == 200 and meta["finish_reason"]["type"] == "abort"
        assert len(out["output_ids"]) == CHUNK * sampler.after  # the tokens sampled before the pause
        assert meta["weight_version"] == "default"
        lps = _trainer_logprobs(models["a"][0], PROMPT + out["output_ids"])[len(PROMPT) :]
        np.testing.assert_allclose([e[0] for e in meta["output_token_logprobs"]], lps, atol=1e-4)

        held, second = _in_thread(_gen, srv.url)
        held.join(0.5)
        assert held.is_alive()  # paused: new requests wait
        status, out = _post(
            srv.url,
            "/update_weights_from_disk",
            {"model_path": str(models["b"][0]), "abort_all_requests": False, "weight_version": "1"},
        )
        assert status == 200 and out["success"] and "Weight version updated to 1" in out["message"]
        assert held.is_alive()
        assert _post(srv.url, "/continue_generation", {})[0] == 200
        held.join(60)
        status, out = second["v"]
        assert status == 200 and out["meta_info"]["weight_version"] == "1"
        lps = _trainer_logprobs(models["b"][0], PROMPT + out["output_ids"])[len(PROMPT) :]
        np.testing.assert_allclose([e[0] for e in out["meta_info"]["output_token_logprobs"]], lps, atol=1e-4)
        status, err = _post(srv.url, "/pause_generation", {"mode": "in_place"})
        assert status == 400 and "in_place" in err["error"]["message"]
    finally:
        sampler.release.set()
        srv.close()


def test_update_without_pause_waits_for_requests_in_flight_and_abort_by_rid(models):
    srv = _gated_server(models["a"][0])
    sampler = srv.engine.sampler
    try:
        sampler.armed.set()
        running, first = _in_thread(_gen, srv.url)
        assert sampler.reached.wait(60)
        body = {"model_path": str(models["b"][0]), "weight_version": "2"}
        update, result = _in_thread(_post, srv.url, "/update_weights_from_disk", body)
        update.join(1.0)
        assert update.is_alive()  # SGLang: the update waits for the request in flight
        sampler.release.set()
        running.join(60)
        update.join(60)
        assert result["v"][0] == 200
        status, out = first["v"]
        assert out["meta_info"]["finish_reason"]["type"] == "length"  # finished, not aborted
        assert out["meta_info"]["weight_version"] == "default" and len(out["output_ids"]) == 40
        assert _gen(srv.url)[1]["meta_info"]["weight_version"] == "2"

        sampler.release.clear()
        sampler.reached.clear()
        sampler.armed.set()

        async def cancel():
            async with RolloutClient(srv.url) as client:
                task = asyncio.ensure_future(
                    client.generate(PROMPT, SamplingParams(max_new_tokens=40), rid="r1")
                )
                while not sampler.reached.is_set():
                    await asyncio.sleep(0.01)
                await client.abort_request("r1")
                sampler.release.set()
                with pytest.raises(RequestAborted, match="r1"):
                    await task

        asyncio.run(cancel())
    finally:
        sampler.release.set()
        srv.close()


@pytest.mark.slow
def test_paused_and_continued_request_draws_as_uninterrupted_with_versions_per_token(models):
    """A seeded request paused after 4 tokens (the client sends its continuation, held until
    `continue`): without a weight change it draws exactly what the uninterrupted request draws
    (draws depend on (seed, position) only); with version 1 loaded during the pause its first 4
    tokens are the uninterrupted ones and carry version "default", the rest carry "1" and are
    model b's draws from the same noise (a fresh request from that point under b)."""
    srv = _gated_server(models["a"][0])
    sampler = srv.engine.sampler
    params = SamplingParams(max_new_tokens=24, sampling_seed=1234)

    async def paused_run(client, new_weights):
        sampler.release.clear()
        sampler.reached.clear()
        sampler.armed.set()
        calls = sampler.calls
        request = asyncio.ensure_future(client.generate(PROMPT, params))
        while not sampler.reached.is_set():
            await asyncio.sleep(0.01)
        pause = asyncio.ensure_future(client.pause_generation("abort"))
        while not srv.engine.paused:
            await asyncio.sleep(0.01)
        sampler.release.set()
        await pause
        if new_weights:
            await client.update_weights_from_disk(str(models["b"][0]), weight_version="1")
        await client.continue_generation()
        gen = await request
        assert sampler.calls == calls + 2  # the aborted piece and its continuation
        return gen

    async def main():
        async with RolloutClient(srv.url) as client:
            whole = await client.generate(PROMPT, params)
            same = await paused_run(client, new_weights=False)
            switched = await paused_run(client, new_weights=True)
            head = whole.output_ids[: CHUNK * sampler.after]
            under_b = await client.generate(PROMPT + head, replace(params, max_new_tokens=24 - len(head)))
            return whole, same, switched, under_b

    try:
        whole, same, switched, under_b = asyncio.run(main())
    finally:
        sampler.release.set()
        srv.close()
    k = CHUNK * sampler.after
    assert len(whole.output_ids) > k, "finished before the pause; pick another seed"
    assert same.output_ids == whole.output_ids and same.weight_versions == ["default"] * len(whole.output_ids)
    np.testing.assert_allclose(same.logprobs, whole.logprobs, atol=1e-5)
    assert switched.output_ids[:k] == whole.output_ids[:k]
    assert switched.weight_versions == ["default"] * k + ["1"] * (len(switched.output_ids) - k)
    assert switched.output_ids[k:] == under_b.output_ids and set(under_b.weight_versions) == {"1"}
    assert switched.output_ids[k:] != whole.output_ids[k:]  # the new weights drew them
    np.testing.assert_allclose(switched.logprobs[k:], under_b.logprobs, atol=1e-5)


class _LoopEnv:
    """Never ends by itself: the episode runs until max_turns; the first step can run a hook."""

    system_prompt = "look"
    task_id = "loop-1"

    def __init__(self):
        self.steps = 0

    def reset(self):
        return "look"

    def step(self, action):
        self.steps += 1
        return Step(observation="key 1")

    def reward(self):
        return 0.0

    def close(self):
        pass


@pytest.mark.slow
def test_weight_update_mid_episode_records_each_tokens_policy_version(tmp_path):
    """Turn 2 is paused after 4 tokens; the trainer loads version 1 and continues: the episode's
    tokens before the pause carry version 0 and their rollout log-probs are model a's, every
    later token carries version 1 with model b's log-probs (so importance weights against either
    version come out exact)."""
    tok = toy_tokenizer(2)
    paths = {}
    for name, seed in (("a", 0), ("b", 1)):
        paths[name] = tmp_path / name
        _tiny_hf(paths[name], seed, vocab=len(tok))
    # one compiled shape for the whole episode: prompts < 128 tokens, turns of <= 24 tokens
    srv = _gated_server(paths["a"], min_prompt_bucket=128, min_new_bucket=32, arm_at_call=2)  # gate turn 2
    sampler = srv.engine.sampler

    async def trainer(client):
        while not sampler.reached.is_set():
            await asyncio.sleep(0.01)
        pause = asyncio.ensure_future(client.pause_generation("abort"))
        while not srv.engine.paused:
            await asyncio.sleep(0.01)
        sampler.release.set()  # the paused request returns at its next chunk: the pause ends
        await pause
        await client.update_weights_from_disk(str(paths["b"]), weight_version="1")
        await client.continue_generation()

    async def main():
        async with RolloutClient(srv.url) as client:
            control = asyncio.ensure_future(trainer(client))
            traj = await run_episode(
                _LoopEnv(),
                client,
                tok,
                sampling=SamplingParams(max_new_tokens=24),
                max_turns=3,
                max_context_tokens=120,
            )
            await control
            return traj

    try:
        traj = asyncio.run(main())
    finally:
        sampler.release.set()
        srv.close()
    assert traj.infra_error is None and traj.num_turns == 3, traj.infra_error
    versions = np.asarray(traj.policy_versions)
    mask = np.asarray(traj.loss_mask, bool)
    assert np.all(versions[~mask] == -1)
    (s1, e1), (s2, e2), (s3, e3) = traj.turn_spans
    sampled2 = np.flatnonzero(mask[s2:e2]) + s2
    assert len(sampled2) > CHUNK * sampler.after, "turn 2 ended before the pause; pick another seed"
    assert np.all(versions[s1:e1][mask[s1:e1]] == 0)
    assert np.all(versions[sampled2[: CHUNK * sampler.after]] == 0)
    assert np.all(versions[sampled2[CHUNK * sampler.after :]] == 1)
    assert np.all(versions[s3:e3][mask[s3:e3]] == 1)

    rollout = np.asarray(traj.rollout_logprobs)
    by_version = {
        0: _trainer_logprobs(paths["a"], traj.input_ids),
        1: _trainer_logprobs(paths["b"], traj.input_ids),
    }
    for v, other in ((0, 1), (1, 0)):
        sel = mask & (versions == v)
        np.testing.assert_allclose(rollout[sel], by_version[v][sel], atol=1e-4)
        assert np.max(np.abs(rollout[sel] - by_version[other][sel])) > 1e-2  # the versions differ
    log_ratio = np.where(versions == 1, by_version[1], by_version[0]) - rollout
    assert np.max(np.abs(log_ratio[mask])) < 1e-4  # importance weights against the sampling version are 1
