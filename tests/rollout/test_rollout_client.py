"""RolloutClient without a model: parameter policy, retries, dead servers, parsing; and
logprob_gap (jaxswe/rollout/bias.py)."""

import asyncio

import numpy as np
import pytest
from aiohttp import web
from helpers import free_port

from jaxswe.errors import UserError
from jaxswe.rollout.bias import logprob_gap
from jaxswe.rollout.client import BiasedSamplingError, RolloutClient, RolloutError
from jaxswe.rollout.protocol import ProtocolError, generation_from_json, parse_generate_body
from jaxswe.rollout.types import SamplingParams


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(top_p=0.95),
        SamplingParams(top_k=20),
        SamplingParams(min_p=0.05),
    ],
)
def test_training_mode_refuses_biased_sampling(params):
    client = RolloutClient("http://127.0.0.1:1")
    with pytest.raises(BiasedSamplingError, match="biased sampling refused"):
        asyncio.run(client.generate([1, 2], params))
    RolloutClient("http://127.0.0.1:1", allow_biased_sampling=True).check_params(params)


def test_invalid_params_are_user_errors():
    client = RolloutClient("http://127.0.0.1:1", allow_biased_sampling=True)
    with pytest.raises(UserError, match="top_k"):
        client.check_params(SamplingParams(top_k=0))
    with pytest.raises(UserError, match="max_new_tokens"):
        client.check_params(SamplingParams(max_new_tokens=-1))
    client.check_params(SamplingParams(max_new_tokens=0))  # SGLang accepts 0 (prompt log-probs only)


def test_dead_server_is_retried_then_reported():
    url = f"http://127.0.0.1:{free_port()}"

    async def main():
        async with RolloutClient(url, max_retries=2, backoff_s=0.01) as client:
            with pytest.raises(RolloutError, match="no rollout server is reachable"):
                await client.check_health()
            with pytest.raises(RolloutError, match="failed after 3 attempts") as info:
                await client.generate([1, 2, 3], SamplingParams(max_new_tokens=4))
            assert url in str(info.value)
            return client.requests_sent[url]

    assert asyncio.run(main()) == 3


def _reply(ids):
    return {
        "output_ids": ids,
        "meta_info": {
            "output_token_logprobs": [[-0.5, t, None] for t in ids],
            "finish_reason": {"type": "length", "length": len(ids)},
            "prompt_tokens": 2,
            "completion_tokens": len(ids),
        },
    }


async def _flaky_server(fail_first: int):
    """A real HTTP server answering 503 to its first `fail_first` /generate calls."""
    seen = []

    async def generate(request):
        seen.append(await request.json())
        if len(seen) <= fail_first:
            return web.Response(status=503, text="overloaded")
        return web.json_response(_reply([5, 6]))

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}", seen


def test_5xx_is_retried_and_sampling_params_are_explicit():
    async def main():
        runner, url, seen = await _flaky_server(fail_first=2)
        try:
            async with RolloutClient(url, max_retries=3, backoff_s=0.01) as client:
                gen = await client.generate([1, 2], SamplingParams(max_new_tokens=2))
        finally:
            await runner.cleanup()
        return gen, seen

    gen, seen = asyncio.run(main())
    assert gen.output_ids == [5, 6] and gen.logprobs == [-0.5, -0.5] and gen.finish_reason == "length"
    assert len(seen) == 3
    sp = seen[-1]["sampling_params"]
    assert sp == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "max_new_tokens": 2,
        "stop_token_ids": [],
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "min_new_tokens": 0,
        "n": 1,
        "ignore_eos": False,
    }
    assert seen[-1]["return_logprob"] is True


def test_4xx_is_not_retried():
    async def main():
        async def generate(request):
            return web.json_response({"error": "bad"}, status=400)

        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        try:
            async with RolloutClient(url, max_retries=3, backoff_s=0.01) as client:
                with pytest.raises(RolloutError, match="HTTP 400"):
                    await client.generate([1], SamplingParams())
                return client.requests_sent[url]
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) == 1


def test_response_parsing_checks_logprobs_against_output_ids():
    gen = generation_from_json(_reply([3, 4]))
    assert gen.output_ids == [3, 4]
    bad = _reply([3, 4])
    bad["meta_info"]["output_token_logprobs"][1][1] = 9
    with pytest.raises(ProtocolError, match="do not match"):
        generation_from_json(bad)
    with pytest.raises(ProtocolError, match="missing"):
        generation_from_json({"output_ids": [1]})


def test_request_parsing_single_batched_and_errors():
    reqs, batched = parse_generate_body({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}})
    assert not batched and reqs[0].params.max_new_tokens == 3 and reqs[0].logprob_start_len == -1
    reqs, batched = parse_generate_body(
        {"input_ids": [[1], [2, 3]], "sampling_params": [{"top_k": 2}, {}], "return_logprob": True}
    )
    assert batched and reqs[0].params.top_k == 2 and reqs[1].params.top_k == -1 and reqs[1].return_logprob
    with pytest.raises(ProtocolError, match="unknown key"):
        parse_generate_body({"input_ids": [1], "sampling_params": {"temprature": 1.0}})
    with pytest.raises(ProtocolError, match="repetition_penalty"):
        parse_generate_body({"input_ids": [1], "sampling_params": {"repetition_penalty": 1.1}})
    parse_generate_body({"input_ids": [1], "sampling_params": {"repetition_penalty": 1.0}})
    with pytest.raises(ProtocolError, match="input_ids"):
        parse_generate_body({"input_ids": []})
    with pytest.raises(ProtocolError, match="out of range"):
        parse_generate_body({"input_ids": [1, 99]}, vocab_size=10)


def test_logprob_gap_against_numpy():
    rng = np.random.default_rng(0)
    rollout = -rng.uniform(0.1, 3, size=(3, 7))
    trainer = rollout + rng.normal(scale=0.01, size=(3, 7))
    mask = rng.uniform(size=(3, 7)) < 0.6
    out = logprob_gap(rollout, trainer, mask)
    d = (trainer - rollout)[mask]
    assert out["mean_abs"] == pytest.approx(np.abs(d).mean())
    assert out["max_abs"] == pytest.approx(np.abs(d).max())
    assert out["kl"] == pytest.approx(np.mean(np.exp(d) - 1 - d)) and out["kl"] >= 0
    assert logprob_gap(rollout, rollout, mask) == {"mean_abs": 0.0, "max_abs": 0.0, "kl": 0.0}
    assert logprob_gap(rollout, trainer, np.zeros_like(mask)) == {"mean_abs": 0.0, "max_abs": 0.0, "kl": 0.0}
    with pytest.raises(ValueError, match="shapes"):
        logprob_gap(rollout, trainer[:, :3], mask)


def test_client_from_config_section():
    from jaxswe.config import RolloutSection
    from jaxswe.rollout.client import client_from_config

    with pytest.raises(UserError, match="rollout.urls"):
        client_from_config(RolloutSection(engine="http"))
    client = client_from_config(RolloutSection(engine="http", urls=["http://h:1/"], max_retries=5))
    assert client.urls == ["http://h:1"] and client.max_retries == 5 and not client.allow_biased_sampling


def _abort_reply(ids, version):
    out = _reply(ids)
    out["meta_info"]["finish_reason"] = {"type": "abort", "message": "Aborted", "status_code": None}
    out["meta_info"]["weight_version"] = version
    return out


async def _scripted_server(replies):
    """A real HTTP server answering /generate from `replies` (the last one repeats) and
    recording every control call's body."""
    seen = []

    async def generate(request):
        seen.append(("/generate", await request.json()))
        return web.json_response(replies[min(len(seen) - 1, len(replies) - 1)])

    async def control(request):
        seen.append((request.path, await request.json()))
        return web.json_response({"success": True, "message": "", "num_paused_requests": 0})

    app = web.Application()
    app.router.add_post("/generate", generate)
    for path in ("/update_weights_from_disk", "/pause_generation", "/continue_generation", "/abort_request"):
        app.router.add_post(path, control)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}", seen


def test_aborted_request_continues_with_per_token_versions_and_control_payloads():
    done = _reply([6, 7])
    done["meta_info"]["weight_version"] = "4"

    async def main():
        runner, url, seen = await _scripted_server([_abort_reply([5], "3"), _abort_reply([], "3"), done])
        try:
            async with RolloutClient(url, max_retries=1) as client:
                gen = await client.generate([1, 2], SamplingParams(max_new_tokens=4), rid="r")
                await client.pause_generation()
                await client.update_weights_from_disk("/w/4", weight_version="4")
                await client.continue_generation()
                await client.abort_request(abort_all=True)
        finally:
            await runner.cleanup()
        return gen, seen

    gen, seen = asyncio.run(main())
    assert gen.output_ids == [5, 6, 7] and gen.finish_reason == "length"
    assert gen.weight_versions == ["3", "4", "4"] and len(gen.logprobs) == 3
    bodies = [b for p, b in seen if p == "/generate"]
    assert [b["input_ids"] for b in bodies] == [[1, 2], [1, 2, 5], [1, 2, 5]]
    assert [b["sampling_params"]["max_new_tokens"] for b in bodies] == [4, 3, 3]
    assert {b["rid"] for b in bodies} == {"r"}
    assert [(p, b) for p, b in seen if p != "/generate"] == [
        ("/pause_generation", {"mode": "abort"}),
        (
            "/update_weights_from_disk",
            {"model_path": "/w/4", "abort_all_requests": False, "weight_version": "4"},
        ),
        ("/continue_generation", {}),
        ("/abort_request", {"rid": "", "abort_all": True}),
    ]


def test_endless_aborts_without_progress_are_an_error():
    async def main():
        runner, url, seen = await _scripted_server([_abort_reply([], "1")])
        try:
            async with RolloutClient(url, max_retries=2) as client:
                with pytest.raises(RolloutError, match="3 times in a row without progress"):
                    await client.generate([1, 2], SamplingParams(max_new_tokens=4))
        finally:
            await runner.cleanup()
        return len(seen)

    assert asyncio.run(main()) == 3


def test_aborts_from_this_clients_pauses_are_not_aborts_without_progress():
    """A request still queued at each of several weight syncs comes back aborted with no tokens
    every time: those aborts came from this client's own pauses, so it keeps continuing it, each
    time after the continue (an abort nobody asked for, without progress, still counts: see the
    test above)."""
    gate: asyncio.Queue = asyncio.Queue()
    answers = [_abort_reply([], "1"), _abort_reply([], "2"), _abort_reply([], "3"), _reply([9])]

    async def main():
        async def generate(request):
            await request.json()
            await gate.get()  # answered once the test has paused the server
            return web.json_response(answers.pop(0))

        async def control(request):
            return web.json_response({"message": "ok", "status": "ok"})

        app = web.Application()
        app.router.add_post("/generate", generate)
        app.router.add_post("/pause_generation", control)
        app.router.add_post("/continue_generation", control)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with RolloutClient(f"http://127.0.0.1:{port}", max_retries=1) as client:
                request = asyncio.ensure_future(client.generate([1, 2], SamplingParams(max_new_tokens=4)))
                for _ in range(3):  # three syncs, each aborting the queued request
                    await client.pause_generation()
                    gate.put_nowait(None)
                    await asyncio.sleep(0.05)
                    assert gate.empty() and not request.done()  # no continuation while paused
                    await client.continue_generation()
                    await asyncio.sleep(0.05)  # the continuation goes out
                gate.put_nowait(None)
                return await request
        finally:
            await runner.cleanup()

    gen = asyncio.run(main())
    assert gen.output_ids == [9] and gen.weight_versions is None
