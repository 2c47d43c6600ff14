"""`jaxswe serve` on tiny Hugging Face Qwen2 models, checked against transformers and token_logprobs."""

import asyncio
import json
import subprocess
import sys
import threading
import urllib.request

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from helpers import free_port

from jaxswe import model as M
from jaxswe.rollout.client import RolloutClient, RolloutError
from jaxswe.rollout.engine import EmbeddedEngine
from jaxswe.rollout.protocol import GenerateRequest
from jaxswe.rollout.sampler import Sampler, decode_steps, prefill
from jaxswe.rollout.server import RolloutServer
from jaxswe.rollout.sglang_launcher import ServerProcess
from jaxswe.rollout.types import SamplingParams
from jaxswe.rollout.weights import load_model

VOCAB = 64
PROMPT = [3, 17, 42, 8, 8, 1, 60, 25, 11]


def _tiny_hf(path, seed, vocab=VOCAB):
    cfg = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, rope_theta=10000.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():  # sharp distributions make the checks meaningful
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.25 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    return model.eval()


def _hf_logprobs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    return [0.0] + [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]


class _ThreadServer:
    """A RolloutServer on its own event loop thread."""

    def __init__(self, engine):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server = RolloutServer(engine, port=0)
        self.url = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(60)
        self.engine = engine

    def close(self):
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    a, b = root / "a", root / "b"
    return {"a": (a, _tiny_hf(a, 0)), "b": (b, _tiny_hf(b, 1))}


@pytest.fixture(scope="module")
def server(models):
    path = str(models["a"][0])
    cfg, params = load_model(path)
    engine = EmbeddedEngine(
        Sampler(cfg, params, seed=0, min_batch_bucket=8), load_fn=load_model, model_path=path, max_batch=8
    )
    srv = _ThreadServer(engine)
    yield srv
    srv.close()


def _post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read()
            return r.status, json.loads(raw) if r.headers.get_content_type() == "application/json" else raw
    except urllib.error.HTTPError as err:
        raw = err.read()
        return err.code, json.loads(raw) if err.headers.get_content_type() == "application/json" else raw


def _generate(url, **kw):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 12}, "return_logprob": True}
    body.update(kw)
    status, out = _post(url, "/generate", body)
    assert status == 200, out
    return out


@pytest.mark.slow
def test_prompt_logprobs_match_transformers(server, models):
    out = _generate(server.url, logprob_start_len=0)
    entries = out["meta_info"]["input_token_logprobs"]
    assert entries[0] == [None, PROMPT[0], None]
    assert [e[1] for e in entries] == PROMPT
    ref = _hf_logprobs(models["a"][1], PROMPT)
    np.testing.assert_allclose([e[0] for e in entries[1:]], ref[1:], atol=1e-4)
    tail = _generate(server.url, logprob_start_len=4)["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in tail] == PROMPT[4:] and tail[0][0] is None  # SGLang: None at the start
    np.testing.assert_allclose([e[0] for e in tail[1:]], ref[5:], atol=1e-4)


@pytest.mark.slow
def test_sampled_logprobs_match_token_logprobs_and_transformers(server, models):
    out = _generate(server.url, sampling_params={"max_new_tokens": 16})
    ids = out["output_ids"]
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 16} and meta["completion_tokens"] == 16
    assert meta["prompt_tokens"] == len(PROMPT)
    assert meta["input_token_logprobs"] == []  # logprob_start_len -1: output tokens only
    rollout = [e[0] for e in meta["output_token_logprobs"]]
    assert [e[1] for e in meta["output_token_logprobs"]] == ids
    cfg, params = load_model(models["a"][0])
    full = jnp.asarray([PROMPT + ids])
    trainer = np.asarray(M.token_logprobs(params, cfg, full))[0, len(PROMPT) :]
    assert np.max(np.abs(trainer - np.asarray(rollout))) < 1e-4
    np.testing.assert_allclose(rollout, _hf_logprobs(models["a"][1], PROMPT + ids)[len(PROMPT) :], atol=1e-4)


def test_greedy_matches_transformers_generate(server, models):
    out = _generate(server.url, sampling_params={"max_new_tokens": 16, "temperature": 0.0})
    with torch.no_grad():
        ref = models["a"][1].generate(
            torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(PROMPT) :]
    assert out["output_ids"] == ref.tolist()


def test_stop_tokens_batching_and_bad_requests(server):
    greedy = _generate(server.url, sampling_params={"max_new_tokens": 8, "temperature": 0.0})["output_ids"]
    stop = greedy[3]
    out = _generate(
        server.url, sampling_params={"max_new_tokens": 8, "temperature": 0.0, "stop_token_ids": [stop]}
    )
    assert out["output_ids"] == greedy[: greedy.index(stop) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    batch = _generate(
        server.url,
        input_ids=[PROMPT, PROMPT[:3]],
        sampling_params=[{"max_new_tokens": 3}, {"max_new_tokens": 5, "top_k": 1}],
    )
    assert isinstance(batch, list) and [len(b["output_ids"]) for b in batch] == [3, 5]
    status, err = _post(server.url, "/generate", {"input_ids": [1] * 300})
    assert status == 400 and "context length" in err["error"]["message"]
    status, err = _post(server.url, "/generate", {"input_ids": [1], "sampling_params": {"temprature": 1}})
    assert status == 400 and "temprature" in err["error"]["message"]
    status, _ = _post(server.url, "/flush_cache", {})
    assert status == 200
    with urllib.request.urlopen(server.url + "/get_model_info") as r:
        assert json.loads(r.read())["model_path"] == server.engine.model_path


def test_concurrent_requests_share_batches_and_balance_over_two_servers(server, models):
    path = str(models["a"][0])
    cfg, params = load_model(path)
    second = _ThreadServer(EmbeddedEngine(Sampler(cfg, params, seed=1, min_batch_bucket=8), max_batch=8))
    n = 16

    async def main():
        async with RolloutClient([server.url, second.url], seed=0) as client:
            assert await client.check_health() == [server.url, second.url]
            gens = await asyncio.gather(
                *(client.generate(PROMPT, SamplingParams(max_new_tokens=6)) for _ in range(n))
            )
            return gens, dict(client.requests_sent)

    before = server.engine.batches_run
    try:
        gens, sent = asyncio.run(main())
    finally:
        second.close()
    assert all(len(g.output_ids) == 6 and len(g.logprobs) == 6 for g in gens)
    assert sent[server.url] == sent[second.url] == n // 2
    assert server.engine.batches_run - before < n // 2  # requests were batched together
    assert len({tuple(g.output_ids) for g in gens}) > 1  # rows draw independent samples


def test_update_weights_follows_new_model_and_bad_path_keeps_old(server, models, tmp_path):
    path_b = str(models["b"][0])
    status, out = _post(server.url, "/update_weights_from_disk", {"model_path": path_b})
    assert status == 200 and out["success"] is True
    ref_b = _hf_logprobs(models["b"][1], PROMPT)

    def prompt_lps():
        entries = _generate(server.url, logprob_start_len=0)["meta_info"]["input_token_logprobs"]
        return [e[0] for e in entries[1:]]

    np.testing.assert_allclose(prompt_lps(), ref_b[1:], atol=1e-4)
    (tmp_path / "config.json").write_text("{not json")
    for bad in [str(tmp_path / "missing"), str(tmp_path)]:
        status, out = _post(server.url, "/update_weights_from_disk", {"model_path": bad})
        assert status == 400 and out["success"] is False and bad in out["message"]
    np.testing.assert_allclose(prompt_lps(), ref_b[1:], atol=1e-4)
    with urllib.request.urlopen(server.url + "/get_model_info") as r:
        assert json.loads(r.read())["model_path"] == path_b

    async def via_client():
        async with RolloutClient(server.url) as client:
            with pytest.raises(RolloutError, match="missing"):
                await client.update_weights_from_disk(str(tmp_path / "missing"))
            await client.update_weights_from_disk(str(models["a"][0]))
            await client.flush_cache()

    asyncio.run(via_client())
    np.testing.assert_allclose(prompt_lps(), _hf_logprobs(models["a"][1], PROMPT)[1:], atol=1e-4)


@pytest.mark.slow
def test_cli_serve_under_the_launcher_and_missing_model(models, tmp_path):
    model = tmp_path / "model"  # model a with EOS ids in generation_config.json
    model.mkdir()
    for f in models["a"][0].iterdir():
        if f.name != "generation_config.json":
            (model / f.name).symlink_to(f)
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 3]}))
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "jaxswe",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--weight-version",
        "5",
        "--enable-deterministic-inference",
    ]
    with ServerProcess(cmd, f"http://127.0.0.1:{port}", log_path=tmp_path / "log") as proc:
        proc.wait_healthy(timeout_s=120, poll_s=0.2)
        with urllib.request.urlopen(proc.url + "/get_server_info") as r:
            assert json.loads(r.read())["enable_deterministic_inference"] is True
        for route in ("/get_model_info", "/model_info"):
            with urllib.request.urlopen(proc.url + route) as r:
                info = json.loads(r.read())
            assert info["model_path"] == str(model) and info["weight_version"] == "5"
            assert info["eos_token_ids"] == [7, 3]
    assert proc.proc.poll() is not None
    res = subprocess.run(
        [sys.executable, "-m", "jaxswe", "serve", "--model", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"jaxswe: error: {tmp_path / 'nope'}: model directory not found"
    ]


def test_sampler_jit_compiles_once_per_bucket(models):
    cfg, params = load_model(models["a"][0])
    sampler = Sampler(cfg, params, min_batch_bucket=8)
    before = prefill._cache_size(), decode_steps._cache_size()
    for n, n_prompt, n_new in [(1, 3, 5), (3, 9, 12), (8, 14, 16)]:  # all in the (8, 16, 16) bucket
        req = GenerateRequest((PROMPT * 2)[:n_prompt], SamplingParams(max_new_tokens=n_new))
        gens = sampler.generate([req] * n)
        assert [len(g.output_ids) for g in gens] == [n_new] * n
    assert prefill._cache_size() - before[0] <= 1 and decode_steps._cache_size() - before[1] <= 1
