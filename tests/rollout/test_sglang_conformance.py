"""Conformance: `RolloutClient` against SGLang 0.5.9's behaviour at pause, abort and weight update.

`Sgl059` below is a fake server that does, for each call the client makes, what SGLang 0.5.9 does
as read in its source (the `sglang==0.5.9` wheel from PyPI, the version the `sglang` extra pins;
paths are under `python/sglang/srt/`, as at tag v0.5.9). Each case's docstring names the source it
replays. Behaviour that differs in other versions is marked so (0.5.6, 0.5.7, 0.5.10 and 0.5.23
wheels read as well). SGLang itself is not run here.

Tokens are a function of (sampling_seed, position) as under --enable-deterministic-inference
(`layers/sampler.py`, `multinomial_with_seed(logprobs, seed, positions)`; positions are
`seq_lens - 1` at prefill and `positions` at decode, `model_executor/model_runner.py`,
`ModelRunner.sample`), so an uninterrupted request and a paused-and-continued one must agree.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import dataclass, field

import numpy as np
import pytest
from aiohttp import web
from helpers import free_port

from jaxswe.errors import UserError
from jaxswe.rollout.client import RequestAborted, RolloutClient, RolloutError
from jaxswe.rollout.types import MAX_SEED, SamplingParams, derive_seed

PROMPT = [5, 6, 7, 8]
STOP = 2  # never drawn by `_tok` unless a case forces it


def _tok(seed: int, pos: int) -> int:
    return 10 + (seed * 1_000_003 + pos * 7919) % 40


@dataclass
class _Req:
    rid: str
    body: dict
    out: list[int] = field(default_factory=list)
    to_finish: bool = False  # Scheduler.abort_request, "Abort method 3: set `to_finish`"
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class Sgl059:
    """One SGLang 0.5.9 server as `RolloutClient` sees it (see the module doc).

    `plan` says what each /generate call does, in order: ("queue", 0) stays in the scheduler's
    waiting queue, ("stall", n) samples n tokens then waits (a long generation), anything else
    (or an empty plan) runs to its end."""

    def __init__(self, *, deterministic: bool = True, duplicate_check: bool = False, dp_size: int = 1):
        self.deterministic = deterministic  # --enable-deterministic-inference
        self.duplicate_check = duplicate_check  # 0.5.10's _validate_rid_not_in_flight
        self.dp_size = dp_size
        self.version = "default"  # server_args.weight_version's default
        self.paused = False
        self.cond = asyncio.Condition()  # TokenizerManager.is_pause_cond
        self.readers = 0  # requests holding model_update_lock.reader_lock
        self.live: dict[str, _Req] = {}  # in the scheduler (waiting queue or running batch)
        self.rid_to_state: set[str] = set()  # TokenizerManager.rid_to_state keys
        self.waiting = 0  # stalled or queued requests (for the tests to synchronise on)
        self.plan: list[tuple[str, int]] = []
        self.token_fn = _tok
        self.bodies: list[dict] = []  # every /generate body, in arrival order
        self.responses: list[dict] = []
        self.control: list[tuple[str, object]] = []  # (path, body) of every control call

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/pause_generation", self.pause_generation)
        app.router.add_post("/continue_generation", self.continue_generation)
        app.router.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        app.router.add_post("/abort_request", self.abort_request)
        app.router.add_post("/flush_cache", self.flush_cache)
        app.router.add_get("/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    # /generate: entrypoints/http_server.py generate_request -> TokenizerManager.generate_request
    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        rid = body.get("rid") or uuid.uuid4().hex
        if self.duplicate_check and rid in self.rid_to_state:
            # 0.5.10 TokenizerManager._validate_rid_not_in_flight -> ValueError -> _create_error_response
            msg = f"Duplicate request IDs detected: {[rid]}"
            return web.json_response({"error": {"message": msg}}, status=400)
        async with self.cond:  # a paused server holds new requests (is_pause_cond.wait_for)
            await self.cond.wait_for(lambda: not self.paused)
        seed = body["sampling_params"].get("sampling_seed")
        if seed is not None:
            # SamplingBatchInfo.from_schedule_batch: torch.tensor([...], dtype=torch.int64)
            np.array([seed], dtype=np.int64)  # OverflowError beyond int64, as torch raises
        self.readers += 1
        req = _Req(rid, body)
        self.live[rid] = req
        self.rid_to_state.add(rid)  # TokenizerManager._send_one_request (overwrites: no check in 0.5.9)
        try:
            kind, n = self.plan.pop(0) if self.plan else ("run", 0)
            out = await (
                self._queued(req) if kind == "queue" else self._run(req, n if kind == "stall" else -1)
            )
        finally:
            self.readers -= 1
            self.live.pop(rid, None)
        self.responses.append(out)
        return web.json_response(out)

    async def _queued(self, req: _Req) -> dict:
        """Scheduler.abort_request "Abort method 1" pops it from the waiting queue and sends
        AbortReq(rid) back; TokenizerManager._handle_abort_req answers with the tokens the
        tokenizer has (none), finish_reason {"type": "abort", "message": "Abort in waiting queue"},
        meta_info.weight_version, and (return_logprob) empty log-prob lists; no prompt_tokens.
        It does not delete rid_to_state[rid] (0.5.9 and 0.5.10; 0.5.23 does)."""
        self.waiting += 1
        await req.wake.wait()
        self.waiting -= 1
        meta = {
            "id": req.rid,
            "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
            "weight_version": self.version,
            "e2e_latency": 0.01,
            "input_token_logprobs": [],
            "output_token_logprobs": [],
            "completion_tokens": 0,
        }
        return {"text": "", "output_ids": [], "meta_info": meta}

    async def _run(self, req: _Req, stall_after: int) -> dict:
        """Scheduler decode steps; Req.check_finished tests `to_finish` (an abort) before the
        length and stop checks, so the token sampled in the aborting step is kept whatever it is.
        The answer: TokenizerManager._handle_batch_output (output_ids accumulated for a
        non-streaming request, meta_info.weight_version = server_args.weight_version, and
        rid_to_state[rid] deleted); FINISH_ABORT().to_json() for an abort."""
        sp = req.body["sampling_params"]
        prompt = req.body["input_ids"]
        seed = sp.get("sampling_seed") if self.deterministic else None
        seed = random.getrandbits(31) if seed is None else seed  # 42 when unseeded; random here
        stops = set(sp.get("stop_token_ids") or ())
        finish = None
        while finish is None:
            if len(req.out) == stall_after and not req.to_finish:
                self.waiting += 1
                await req.wake.wait()
                self.waiting -= 1
            req.out.append(self.token_fn(seed, len(prompt) + len(req.out) - 1))
            if req.to_finish:
                finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
            elif len(req.out) >= sp["max_new_tokens"]:
                finish = {"type": "length", "length": sp["max_new_tokens"]}
            elif req.out[-1] in stops:
                finish = {"type": "stop", "matched": req.out[-1]}
            await asyncio.sleep(0)
        self.rid_to_state.discard(req.rid)
        start = req.body.get("logprob_start_len", -1)
        start = len(prompt) - 1 if start == -1 else start
        meta = {
            "id": req.rid,
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "weight_version": self.version,
            "total_retractions": 0,
            "input_token_logprobs": [
                [None if i == start else -0.5, prompt[i], None] for i in range(start, len(prompt))
            ],
            "output_token_logprobs": [[-0.01 * t, t, None] for t in req.out],
            "completion_tokens": len(req.out),
            "cached_tokens": 0,
            "e2e_latency": 0.01,
        }
        return {"text": "", "output_ids": list(req.out), "meta_info": meta}

    def _abort(self, rid: str, abort_all: bool) -> None:
        # Scheduler.abort_request: every request whose rid *starts with* the given one
        for req in list(self.live.values()):
            if abort_all or req.rid.startswith(rid):
                req.to_finish = True
                req.wake.set()

    # TokenizerManager.pause_generation / continue_generation, http_server.py pause_generation
    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.control.append(("/pause_generation", body))
        async with self.cond:
            self.paused = True
            if body.get("mode", "abort") == "abort":
                while True:  # abort_request(abort_all=True) until no request holds the reader lock
                    self._abort("", abort_all=True)
                    if self.readers == 0:
                        break
                    await asyncio.sleep(0.005)  # 1.0 s in 0.5.9
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.control.append(("/continue_generation", await request.json()))
        async with self.cond:
            self.paused = False
            self.cond.notify_all()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """http_server.py update_weights_from_disk: {success, message, num_paused_requests}, 400
        when not loaded; TokenizerManager.update_weights_from_disk takes the writer lock unless
        paused and sets the version only on success when weight_version is given; with dp_size > 1
        the message is joined with " | " and num_paused_requests is a list."""
        body = await request.json()
        self.control.append(("/update_weights_from_disk", body))
        while not self.paused and self.readers:  # model_update_lock.writer_lock
            await asyncio.sleep(0.005)
        ok = body["model_path"] != "/missing"
        msgs = ["Succeeded to update model weights." if ok else "Failed to get weights iterator: /missing."]
        message = " | ".join(msgs * self.dp_size)
        if ok and body.get("weight_version") is not None:
            self.version = body["weight_version"]
            message += f" Weight version updated to {self.version}."
        paused = [0] * self.dp_size if self.dp_size > 1 else 0
        content = {"success": ok, "message": message, "num_paused_requests": paused}
        return web.json_response(content, status=200 if ok else 400)

    async def abort_request(self, request: web.Request) -> web.Response:
        """TokenizerManager.abort_request forwards only a rid it has (or abort_all); 200, no body."""
        body = await request.json()
        self.control.append(("/abort_request", body))
        if body.get("abort_all") or body.get("rid") in self.rid_to_state:
            self._abort(body.get("rid") or "", bool(body.get("abort_all")))
        return web.Response(status=200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.control.append(("/flush_cache", None))
        return web.Response(text="Cache flushed.\n", status=400 if self.live else 200)

    async def stalled(self, n: int) -> None:
        for _ in range(2000):
            if self.waiting >= n:
                return
            await asyncio.sleep(0.001)
        raise AssertionError(f"{self.waiting} of {n} requests reached their stall")


def _run(case, **server_kwargs):
    """Start an `Sgl059` on a free port and run `case(server, client, url)`."""

    async def main():
        server = Sgl059(**server_kwargs)
        runner = web.AppRunner(server.app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        try:
            async with RolloutClient(url, max_retries=2, backoff_s=0.01) as client:
                return await asyncio.wait_for(case(server, client, url), 10)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def _reference(seed: int, n: int, prompt=PROMPT) -> list[int]:
    return [_tok(seed, len(prompt) + i - 1) for i in range(n)]


def test_running_request_aborted_by_a_pause_continues_token_exact():
    """A running request at `/pause_generation {"mode": "abort"}` (TokenizerManager.pause_generation:
    abort_request(abort_all=True), re-sent until model_update_lock has no reader; the call returns
    after every request has answered) answers HTTP 200 with its tokens so far, their log-probs,
    finish_reason FINISH_ABORT().to_json() = {"type": "abort", "message": "Aborted", "status_code":
    None, "err_type": None} (managers/schedule_batch.py) and meta_info.weight_version (the old
    one). The client resends it after its continue: same rid and sampling_seed, prompt + tokens,
    the rest of the budget, no prompt log-probs; the pieces join into the uninterrupted draw with
    each token's version."""
    seed = derive_seed("conformance", 1)

    async def case(server, client, url):
        server.plan = [("stall", 3)]
        params = SamplingParams(max_new_tokens=8, sampling_seed=seed)
        task = asyncio.create_task(client.generate(PROMPT, params, rid="r1"))
        await server.stalled(1)
        await client.update_weights_from_disk("/w", weight_version="1", pause=True)
        gen = await task
        first, second = server.bodies
        assert server.responses[0]["meta_info"]["finish_reason"] == {
            "type": "abort", "message": "Aborted", "status_code": None, "err_type": None}  # fmt: skip
        assert server.responses[0]["meta_info"]["weight_version"] == "default"
        assert second["rid"] == first["rid"] == "r1"
        assert second["sampling_params"]["sampling_seed"] == seed
        assert second["input_ids"] == PROMPT + gen.output_ids[:4]  # 3 + the aborting step's token
        assert second["sampling_params"]["max_new_tokens"] == 4 and second["logprob_start_len"] == -1
        assert [p for p, _ in server.control] == [
            "/pause_generation", "/update_weights_from_disk", "/continue_generation"]  # fmt: skip
        return gen

    gen = _run(case)
    assert gen.output_ids == _reference(seed, 8) and gen.finish_reason == "length"
    assert gen.weight_versions == ["default"] * 4 + ["1"] * 4
    assert gen.logprobs == [-0.01 * t for t in gen.output_ids]


def test_queued_request_at_a_pause_comes_back_empty_and_is_continued():
    """A request still in the scheduler's waiting queue at an abort-mode pause (Scheduler.abort_request,
    "Abort method 1") comes back through TokenizerManager._handle_abort_req: HTTP 200, output_ids
    [], finish_reason {"type": "abort", "message": "Abort in waiting queue"}, meta_info.weight_version
    (0.5.9; 0.5.6 and 0.5.7 leave it out there), empty log-prob lists, no prompt_tokens. Its rid
    stays in rid_to_state (not deleted there); 0.5.9 accepts the resend with the same rid anyway
    (no duplicate check: _send_one_request overwrites). The client resends it whole, still asking
    for the prompt log-probs, and every token carries the new version."""
    seed = derive_seed("conformance", 2)

    async def case(server, client, url):
        server.plan = [("queue", 0)]
        params = SamplingParams(max_new_tokens=5, sampling_seed=seed)
        task = asyncio.create_task(client.generate(PROMPT, params, logprob_start_len=1, rid="q1"))
        await server.stalled(1)
        await client.update_weights_from_disk("/w", weight_version="1", pause=True)
        gen = await task
        assert (
            server.responses[0]["output_ids"] == []
            and "prompt_tokens" not in server.responses[0]["meta_info"]
        )
        assert [b["rid"] for b in server.bodies] == ["q1", "q1"]
        assert server.bodies[1]["input_ids"] == PROMPT and server.bodies[1]["logprob_start_len"] == 1
        assert server.bodies[1]["sampling_params"]["max_new_tokens"] == 5
        return gen

    gen = _run(case)
    assert gen.output_ids == _reference(seed, 5) and gen.weight_versions == ["1"] * 5
    assert gen.prompt_logprobs == [0.0, -0.5, -0.5]  # from the resend: None (start) read as 0.0


def test_empty_abort_without_weight_version_keeps_the_versions():
    """0.5.6 and 0.5.7's _handle_abort_req leave meta_info.weight_version out of the queued-abort
    answer (0.5.9 has it): a piece without tokens adds no versions and must not drop the others."""

    async def case(server, client, url):
        server.plan = [("queue", 0)]
        orig = server._queued

        async def no_version(req):
            out = await orig(req)
            del out["meta_info"]["weight_version"]
            return out

        server._queued = no_version
        task = asyncio.create_task(client.generate(PROMPT, SamplingParams(max_new_tokens=3, sampling_seed=3)))
        await server.stalled(1)
        await client.update_weights_from_disk("/w", weight_version="2", pause=True)
        return await task

    assert _run(case).weight_versions == ["2"] * 3


def test_token_of_the_aborting_step_that_is_a_stop_token_ends_the_request():
    """Req.check_finished (managers/schedule_batch.py) tests `to_finish` first, so the token sampled
    in the step that carries the abort is kept and the answer says "abort" even when that token is
    a stop token: the request is complete. The client must not send a continuation past it (it
    did before this suite: the model went on after its end-of-turn token)."""

    async def case(server, client, url):
        server.plan = [("stall", 2)]
        server.token_fn = lambda seed, pos: STOP if pos == len(PROMPT) + 1 else _tok(seed, pos)
        params = SamplingParams(max_new_tokens=8, sampling_seed=4, stop_token_ids=(STOP,))
        task = asyncio.create_task(client.generate(PROMPT, params))
        await server.stalled(1)
        await client.update_weights_from_disk("/w", weight_version="1", pause=True)
        gen = await task
        assert len(server.bodies) == 1
        return gen

    gen = _run(case)
    assert gen.finish_reason == "stop" and gen.output_ids[-1] == STOP and len(gen.output_ids) == 3
    assert gen.weight_versions == ["default"] * 3


def test_token_of_the_aborting_step_that_fills_the_budget_ends_the_request():
    """Same order in Req.check_finished: an abort answer may hold max_new_tokens tokens (the length
    check never ran); the request is complete with finish "length", no continuation."""

    async def case(server, client, url):
        server.plan = [("stall", 2)]
        task = asyncio.create_task(client.generate(PROMPT, SamplingParams(max_new_tokens=3, sampling_seed=5)))
        await server.stalled(1)
        await client.update_weights_from_disk("/w", weight_version="1", pause=True)
        gen = await task
        assert len(server.bodies) == 1
        return gen

    gen = _run(case)
    assert gen.finish_reason == "length" and gen.output_ids == _reference(5, 3)


def test_requests_during_a_pause_by_someone_else_are_held_until_continue():
    """TokenizerManager.generate_request waits on is_pause_cond until `is_pause` is cleared before it
    takes the reader lock: a request sent to a paused server is held, not refused, and a held one
    does not keep an abort-mode pause from returning. A request aborted by someone else's pause is
    resent at once (held there), a new one too; both run under the weights loaded meanwhile
    (update_weights_from_disk while paused: no writer lock, applied at once)."""
    seed = derive_seed("conformance", 6)

    async def case(server, client, url):
        server.plan = [("stall", 2)]
        params = SamplingParams(max_new_tokens=6, sampling_seed=seed)
        first = asyncio.create_task(client.generate(PROMPT, params, rid="a"))
        await server.stalled(1)
        async with client._get_session().post(url + "/pause_generation", json={"mode": "abort"}) as r:
            assert r.status == 200 and (await r.json())["status"] == "ok"
        second = asyncio.create_task(client.generate(PROMPT, params, rid="b"))
        for _ in range(1000):
            if len(server.bodies) == 3:
                break
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.02)
        assert len(server.bodies) == 3 and not first.done() and not second.done()  # both held
        update = {"model_path": "/w", "weight_version": "7"}
        async with client._get_session().post(url + "/update_weights_from_disk", json=update) as r:
            assert r.status == 200 and (await r.json())["success"] is True
        async with client._get_session().post(url + "/continue_generation", json={}) as r:
            assert r.status == 200
        return await first, await second

    a, b = _run(case)
    assert a.output_ids == b.output_ids == _reference(seed, 6)
    assert a.weight_versions == ["default"] * 3 + ["7"] * 3 and b.weight_versions == ["7"] * 6


def test_abort_request_also_aborts_requests_whose_rid_it_prefixes():
    """Scheduler.abort_request aborts every request whose rid starts with the given one (gated in
    TokenizerManager.abort_request on the exact rid being registered). Cancelling "ep1" also
    aborts "ep1-t2", which answers like a paused request: the cancelled one raises
    RequestAborted, the other is continued to its end. (The client's own rids are uuid4 hex,
    all of one length, so they never prefix each other.)"""
    seed = derive_seed("conformance", 7)

    async def case(server, client, url):
        server.plan = [("stall", 2), ("stall", 2)]
        params = SamplingParams(max_new_tokens=5, sampling_seed=seed)
        cancelled = asyncio.create_task(client.generate(PROMPT, params, rid="ep1"))
        await server.stalled(1)
        other = asyncio.create_task(client.generate(PROMPT, params, rid="ep1-t2"))
        await server.stalled(2)
        await client.abort_request("ep1")
        with pytest.raises(RequestAborted, match="ep1"):
            await cancelled
        assert ("/abort_request", {"rid": "ep1", "abort_all": False}) in server.control
        return await other

    gen = _run(case)
    assert gen.output_ids == _reference(seed, 5) and gen.finish_reason == "length"


def test_continuation_refused_as_a_duplicate_rid_goes_out_under_a_new_rid():
    """Not 0.5.9: 0.5.10 adds TokenizerManager._validate_rid_not_in_flight ("Duplicate request IDs
    detected", HTTP 400; 0.5.23: "Duplicate request ID detected") while _handle_abort_req still
    leaves the rid of a request aborted in the waiting queue in rid_to_state, so its continuation
    under the same rid is refused (0.5.23 deletes it there). The client then sends it under a new
    rid (once per piece; a first request refused as a duplicate is an error), and
    `abort_request(rid)` aborts it under that rid."""
    seed = derive_seed("conformance", 8)

    async def case(server, client, url):
        server.plan = [("queue", 0), ("stall", 1), ("queue", 0)]
        params = SamplingParams(max_new_tokens=3, sampling_seed=seed)
        task = asyncio.create_task(client.generate(PROMPT, params, rid="d1"))
        await server.stalled(1)
        await client.update_weights_from_disk("/w", weight_version="1", pause=True)
        await server.stalled(1)
        rids = [b["rid"] for b in server.bodies]
        assert rids[:2] == ["d1", "d1"] and rids[2].startswith("d1-") and len(rids) == 3
        await client.abort_request("d1")
        assert server.control[-1] == ("/abort_request", {"rid": rids[2], "abort_all": False})
        with pytest.raises(RequestAborted):
            await task
        task = asyncio.create_task(client.generate(PROMPT, params, rid="d2"))
        await server.stalled(1)
        await client.update_weights_from_disk("/w", weight_version="2", pause=True)
        gen = await task
        server.rid_to_state.add("d3")
        with pytest.raises(RolloutError, match="Duplicate request IDs detected"):
            await client.generate(PROMPT, params, rid="d3")
        return gen

    gen = _run(case, duplicate_check=True)
    assert gen.output_ids == _reference(seed, 3) and gen.weight_versions == ["2"] * 3


def test_update_pause_continue_abort_wire_format():
    """Request bodies as io_struct.py declares them: UpdateWeightFromDiskReqInput {model_path,
    abort_all_requests, weight_version, ...}, PauseGenerationReqInput {mode: "abort" | "retract" |
    "in_place"}, ContinueGenerationReqInput {}, AbortReq {rid, abort_all}; answers as http_server.py
    gives them (update: 200/400 with {success, message, num_paused_requests}, a list of counts
    with dp_size > 1; /abort_request: 200 without a body). A failed update names the worker."""

    async def case(server, client, url):
        await client.update_weights_from_disk("/w", weight_version="3", pause=True)
        await client.abort_request(abort_all=True)
        await client.flush_cache()
        assert server.control == [
            ("/pause_generation", {"mode": "abort"}),
            ("/update_weights_from_disk",
             {"model_path": "/w", "abort_all_requests": False, "weight_version": "3"}),
            ("/continue_generation", {}),
            ("/abort_request", {"rid": "", "abort_all": True}),
            ("/flush_cache", None),
        ]  # fmt: skip
        assert server.version == "3"
        with pytest.raises(RolloutError, match=r"HTTP 400.*Failed to get weights iterator") as info:
            await client.update_weights_from_disk("/missing", weight_version="4", pause=True)
        assert url in str(info.value) and server.version == "3" and not server.paused
        server.dp_size = 2
        await client.update_weights_from_disk("/w", weight_version="5")
        assert server.version == "5"

    _run(case)


def test_sampling_seeds_fit_sglang_0_5_9_int64():
    """SamplingBatchInfo.from_schedule_batch (sampling/sampling_batch_info.py) holds sampling_seed
    as torch.int64 under --enable-deterministic-inference (int32 in 0.5.6, int64 from 0.5.7), and
    SamplingParams (sampling/sampling_params.py) does not check it: a seed past int64 fails inside
    the scheduler. jaxswe's seeds are in [0, 2**63); the client refuses others before sending."""
    seeds = [derive_seed("episode", s, t, k) for s in (0, 1, 2**70) for t in ("a", 3) for k in range(50)]
    assert all(0 <= s < MAX_SEED == 2**63 for s in seeds)
    np.array(seeds, dtype=np.int64)  # what torch.tensor(..., dtype=torch.int64) takes

    async def case(server, client, url):
        for bad in (2**63, -1):
            with pytest.raises(UserError, match="sampling_seed"):
                await client.generate(PROMPT, SamplingParams(max_new_tokens=1, sampling_seed=bad))
        assert server.bodies == []
        await client.generate(PROMPT, SamplingParams(max_new_tokens=1, sampling_seed=2**63 - 1))
        assert server.bodies[0]["sampling_params"]["sampling_seed"] == 2**63 - 1

    _run(case)


def test_real_sglang_router_forwards_rid_seed_and_meta_info():
    """The real sglang-router 0.3.2 (pip, the dev extra) in front of a fake worker: it re-serialises
    /generate through its typed request (adding its own defaults) but keeps rid, logprob_start_len,
    return_logprob and a 63-bit sampling_seed, and returns the worker's answer as is (an abort's
    finish_reason, meta_info.weight_version). It has no /pause_generation, /continue_generation,
    /abort_request or /update_weights_from_disk route (404): the client sends those to each worker."""
    import subprocess
    import sys
    import urllib.request

    pytest.importorskip("sglang_router")
    got: list[dict] = []
    answer = {"text": "", "output_ids": [3], "meta_info": {
        "id": "r9", "output_token_logprobs": [[-1.0, 3, None]], "weight_version": "v7",
        "finish_reason": {"type": "abort", "message": "Aborted", "status_code": None,
                          "err_type": None}}}  # fmt: skip

    async def generate(request):
        got.append(await request.json())
        return web.json_response(answer)

    async def ok(request):
        return web.json_response({"model_path": "m", "weight_version": "v7"})

    async def main():
        app = web.Application()
        app.router.add_post("/generate", generate)
        for path in ("/health", "/get_model_info", "/get_server_info"):
            app.router.add_get(path, ok)
        runner = web.AppRunner(app)
        await runner.setup()
        port, router_port = free_port(), free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        router = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
             str(router_port), "--worker-urls", f"http://127.0.0.1:{port}", "--policy", "round_robin",
             "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        router_url = f"http://127.0.0.1:{router_port}"
        try:
            for _ in range(200):
                try:
                    await asyncio.to_thread(urllib.request.urlopen, router_url + "/health", None, 1)
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            body = {"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": 2, "rid": "r9",
                    "sampling_params": {"max_new_tokens": 4, "sampling_seed": 2**63 - 1}}  # fmt: skip
            async with RolloutClient(router_url) as client:
                async with client._get_session().post(router_url + "/generate", json=body) as r:
                    assert r.status == 200 and await r.json() == answer
                for path in ("/pause_generation", "/continue_generation", "/abort_request",
                             "/update_weights_from_disk"):  # fmt: skip
                    async with client._get_session().post(router_url + path, json={}) as r:
                        assert r.status == 404, path
        finally:
            router.kill()
            router.wait()
            await runner.cleanup()

    asyncio.run(main())
    (sent,) = got
    assert sent["rid"] == "r9" and sent["logprob_start_len"] == 2 and sent["return_logprob"] is True
    assert sent["input_ids"] == PROMPT and sent["sampling_params"]["sampling_seed"] == 2**63 - 1
