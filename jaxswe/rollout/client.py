"""`RolloutClient`: the trainer's `Engine` over SGLang's native HTTP API (or `jaxswe serve`).

Many requests in flight over one aiohttp session; each goes to the server with the fewest requests
in flight (ties in round-robin order), or all to one sglang-router URL (`router`), while control
calls (weight updates, cache flushes, health) always go to every worker URL: the router has no
`/update_weights_from_disk` route and answers `/health` 200 with no live worker. Connection errors,
timeouts and 5xx answers are retried with exponential backoff, preferring another server; 4xx
answers are not retried. A worker that does not answer at all is left out of control calls and
weight updates with one log line (`stale`); it loads the newest weights and takes part again once
it answers /health (`rejoin`: at the next weight update, or within `rejoin_every_s` of a generate
call). Behind a router, until then the router may send it requests, answered under its old
weights; their tokens carry its older `weight_version` (rl.max_staleness > 0 drops them as stale).
Sampling parameters are sent explicitly on every request, and in training mode
(`allow_biased_sampling=False`) anything but the model's full softmax is refused.

Partial rollouts: a request that comes back aborted by `/pause_generation` (finish_reason
"abort") is sent again as its continuation (prompt + the tokens so far, the rest of the budget,
the same `sampling_seed`): after this client's `continue_generation` when this client paused the
servers, at once otherwise (SGLang holds it until `/continue_generation`), so it goes on under
the new weights. The returned Generation joins the pieces, and `weight_versions` records for every
token the weight version (`meta_info.weight_version`) of the server that sampled it. A seeded
draw depends only on (seed, position) and the logits (SGLang's `sampling_seed` under
--enable-deterministic-inference, and `jaxswe serve`), so a continuation draws what the
uninterrupted request would have drawn from the same weights. An aborted piece that ends in one
of the request's stop tokens or fills its budget ends the request (SGLang keeps the token of the
aborting step whatever it is). A continuation refused as a duplicate rid (SGLang 0.5.10+, after
an abort in the waiting queue) is sent under a new rid. Requests cancelled with
`abort_request` raise `RequestAborted` instead. `update_weights_from_disk(..., pause=True)` is the
weight handover with requests in flight (see there).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

import aiohttp

from jaxswe.errors import UserError
from jaxswe.rollout.protocol import (
    ProtocolError,
    check_sampling_params,
    generation_from_json,
    sampling_params_to_json,
)
from jaxswe.rollout.types import Generation, SamplingParams

log = logging.getLogger(__name__)


class RolloutError(UserError):
    """Rollout servers unreachable or answering with errors; the message names them."""


class BiasedSamplingError(UserError):
    """Sampling parameters other than the full softmax at temperature 1 in training mode."""


class RequestAborted(RolloutError):
    """A request cancelled with `RolloutClient.abort_request`."""


class _Unreachable(Exception):
    """A connection error or timeout: the server did not answer at all."""


class _RetryableError(Exception):
    pass


class RolloutClient:
    """`Engine` over one or more SGLang-compatible servers."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout: float = 600.0,
        max_retries: int = 3,
        allow_biased_sampling: bool = False,
        seed: int = 0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 16.0,
        router: str | None = None,
    ):
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise UserError(
                "RolloutClient needs at least one server URL (with a router: the workers behind it)"
            )
        self.urls = [u.rstrip("/") for u in urls]  # the workers: control calls go to each
        self.generate_urls = [router.rstrip("/")] if router else self.urls
        self.timeout = timeout
        self.max_retries = max_retries
        self.allow_biased_sampling = allow_biased_sampling
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._rng = random.Random(seed)  # backoff jitter only; servers own the sampling seed
        every = list(dict.fromkeys([*self.urls, *self.generate_urls]))
        self.in_flight = dict.fromkeys(every, 0)
        self.requests_sent = dict.fromkeys(every, 0)
        self._down_until = dict.fromkeys(every, 0.0)
        self._next = 0
        self._session: aiohttp.ClientSession | None = None
        self._rids: set[str] = set()  # generate() calls in flight
        self._cancelled: set[str] = set()  # of those, cancelled with abort_request
        self._wire: dict[str, str] = {}  # of those, the rid their continuation was sent under instead
        self._pauses = 0  # pause_generation calls so far: aborts they caused are expected
        self._pausing = False  # between this client's pause_generation and continue_generation
        self.stale: set[str] = set()  # workers unreachable at a weight update: they serve old weights
        self._weights: dict[str, Any] | None = None  # the newest update's payload, for rejoining workers
        self.rejoin_every_s = 5.0  # while workers are left out, generate() probes them this often
        self._next_rejoin = 0.0
        self._rejoining = False

    # -- session -------------------------------------------------------------------------------
    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0)  # no cap: the caller bounds concurrency
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout)
            )
        return self._session

    # -- load balancing ------------------------------------------------------------------------
    def _pick(self, avoid: str | None) -> str:
        now = time.monotonic()
        n = len(self.generate_urls)
        order = [self.generate_urls[(self._next + i) % n] for i in range(n)]
        self._next = (self._next + 1) % n
        up = [u for u in order if self._down_until[u] <= now and u not in self.stale] or order
        if avoid is not None and len(up) > 1:
            up = [u for u in up if u != avoid]
        return min(up, key=lambda u: self.in_flight[u])

    async def _post_once(self, url: str, path: str, payload: dict[str, Any] | None) -> Any:
        self.in_flight[url] += 1
        self.requests_sent[url] += 1
        try:
            async with self._get_session().post(url + path, json=payload) as resp:
                text = await resp.text()
                if resp.status >= 500:
                    raise _RetryableError(f"{url}{path}: HTTP {resp.status}: {text[:200]}")
                if resp.status >= 400:
                    raise RolloutError(f"{url}{path}: HTTP {resp.status}: {text[:500]}")
                try:
                    return await resp.json(content_type=None)
                except ValueError:
                    return text
        except (TimeoutError, aiohttp.ClientConnectionError) as err:
            self._down_until[url] = time.monotonic() + self.backoff_s
            raise _RetryableError(f"{url}{path}: {type(err).__name__}: {err}") from _Unreachable()
        finally:
            self.in_flight[url] -= 1

    async def _post(self, path: str, payload: dict[str, Any]) -> Any:
        """POST to the least-loaded server, retrying elsewhere on connection errors and 5xx."""
        last_url: str | None = None
        errors: list[str] = []
        for attempt in range(self.max_retries + 1):
            url = self._pick(avoid=last_url)
            try:
                return await self._post_once(url, path, payload)
            except _RetryableError as err:
                errors.append(str(err))
                last_url = url
                if attempt < self.max_retries:
                    delay = min(self.max_backoff_s, self.backoff_s * 2**attempt)
                    await asyncio.sleep(delay * (0.5 + self._rng.random()))
        raise RolloutError(f"{path} failed after {self.max_retries + 1} attempts; last error: {errors[-1]}")

    # -- Engine --------------------------------------------------------------------------------
    def check_params(self, params: SamplingParams) -> None:
        """Raise if `params` are invalid, or biased while in training mode."""
        try:
            check_sampling_params(params)
        except ProtocolError as err:
            raise UserError(str(err)) from None
        if not self.allow_biased_sampling and not params.unbiased:
            raise BiasedSamplingError(
                f"biased sampling refused in training mode: temperature={params.temperature} "
                f"top_p={params.top_p} top_k={params.top_k} min_p={params.min_p} "
                "(RL needs temperature 1, top_p 1, top_k -1, min_p 0; set allow_biased_sampling for eval)"
            )

    async def generate(
        self,
        input_ids: list[int],
        params: SamplingParams,
        *,
        logprob_start_len: int = -1,
        rid: str | None = None,
    ) -> Generation:
        """Sample one completion with the log-probs of its tokens (and of the prompt from
        `logprob_start_len` when >= 0), continuing it across pauses (see the module doc)."""
        self.check_params(params)
        rid = rid or uuid.uuid4().hex
        if rid in self._rids:
            raise UserError(f"request id {rid!r} is already in flight")
        self._rids.add(rid)
        if self.stale and not (self._rejoining or self._pausing) and time.monotonic() >= self._next_rejoin:
            self._next_rejoin = time.monotonic() + self.rejoin_every_s
            self._rejoining = True
            try:
                await self.rejoin()
            finally:
                self._rejoining = False
        try:
            return await self._generate(list(input_ids), params, logprob_start_len, rid)
        finally:
            self._rids.discard(rid)
            self._cancelled.discard(rid)
            self._wire.pop(rid, None)

    async def _generate(
        self, input_ids: list[int], params: SamplingParams, start: int, rid: str
    ) -> Generation:
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[str] | None = []
        prompt_logprobs = None
        empty_aborts = 0
        pieces, refused = 0, False
        while True:
            remaining = params.max_new_tokens - len(ids)
            payload = {
                "input_ids": input_ids + ids,
                "sampling_params": sampling_params_to_json(
                    dataclasses.replace(params, max_new_tokens=remaining)
                ),
                "return_logprob": True,
                "logprob_start_len": start if not ids else -1,
                "rid": self._wire.get(rid, rid),
            }
            pauses = self._pauses
            try:
                obj = await self._post("/generate", payload)
            except RolloutError as err:
                # SGLang 0.5.10+ refuse a rid still registered, and leave the rid of a request aborted
                # while queued registered: that continuation goes out under a new rid (0.5.9 accepts)
                if not pieces or refused or "Duplicate request ID" not in str(err):
                    raise
                refused, self._wire[rid] = True, f"{rid}-{uuid.uuid4().hex[:12]}"
                continue
            pieces, refused = pieces + 1, False
            if isinstance(obj, list) and len(obj) == 1:
                obj = obj[0]
            try:
                part = generation_from_json(obj, want_prompt_logprobs=start >= 0 and not ids)
            except ProtocolError as err:
                raise RolloutError(str(err)) from None
            if not ids:
                prompt_logprobs = part.prompt_logprobs
            ids += part.output_ids
            logprobs += part.logprobs
            if part.output_ids:  # an empty piece (queued at the abort) may carry no version (< 0.5.9)
                versions = (
                    None
                    if versions is None or part.weight_versions is None
                    else versions + part.weight_versions
                )
            if part.finish_reason != "abort":
                finish = part.finish_reason
                break
            if rid in self._cancelled:
                raise RequestAborted(f"request {rid} was aborted after {len(ids)} tokens")
            # an abort without progress counts, unless this client paused the servers meanwhile
            # (a request still queued at a weight update has sampled nothing yet)
            empty_aborts = 0 if part.output_ids or self._pauses != pauses else empty_aborts + 1
            if empty_aborts > self.max_retries:
                raise RolloutError(
                    f"request {rid} was aborted {empty_aborts} times in a row without progress"
                )
            # SGLang's abort wins over the other finish checks (Req.check_finished tests `to_finish`
            # first): the token sampled in the aborting step may fill the budget or be a stop token,
            # and then the request is complete; continuing it would sample past its end
            if len(ids) >= params.max_new_tokens:
                finish = "length"
                break
            if part.output_ids and part.output_ids[-1] in params.stop_token_ids:
                finish = "stop"
                break
            # after this client's own pause, the continuation waits for its continue (SGLang would
            # hold it until then anyway: a held request waits for the pause to clear)
            while self._pausing:
                await asyncio.sleep(0.01)
        return Generation(ids, logprobs, finish, prompt_logprobs, versions)

    # -- control -------------------------------------------------------------------------------
    async def _get_status(self, url: str, path: str) -> tuple[str, int | str]:
        try:
            async with self._get_session().get(url + path, timeout=aiohttp.ClientTimeout(total=10)) as r:
                await r.read()
                return url, r.status
        except (TimeoutError, aiohttp.ClientError) as err:
            return url, f"{type(err).__name__}: {err}"

    async def check_health(self) -> list[str]:
        """GET /health on every worker (never the router); returns the healthy ones, raises if none is."""
        results = await asyncio.gather(*(self._get_status(u, "/health") for u in self.urls))
        healthy = [u for u, s in results if s == 200]
        for u, s in results:
            if s != 200:
                log.warning("rollout server %s is not healthy: %s", u, s)
                self._down_until[u] = time.monotonic() + self.max_backoff_s
        if not healthy:
            detail = "; ".join(f"{u}: {s}" for u, s in results)
            raise RolloutError(f"no rollout server is reachable ({detail})")
        return healthy

    async def _post_all(self, path: str, payload: dict[str, Any] | None) -> list[Any]:
        """POST to every worker but the stale ones (each retried); a worker that does not answer
        at all is skipped (`_skip`); raises, once every worker has answered, naming those that
        answered with an error, or when none answered."""

        async def one(url: str) -> Any:
            for attempt in range(self.max_retries + 1):
                try:
                    return await self._post_once(url, path, payload)
                except _RetryableError as err:
                    if attempt == self.max_retries:
                        if isinstance(err.__cause__, _Unreachable):
                            return self._skip(url, str(err), path)
                        raise RolloutError(str(err)) from None
                    await asyncio.sleep(min(self.max_backoff_s, self.backoff_s * 2**attempt))

        live = [u for u in self.urls if u not in self.stale]
        results = await asyncio.gather(*(one(u) for u in live), return_exceptions=True)
        failed = [str(r) for r in results if isinstance(r, BaseException)]
        if failed:
            raise RolloutError(f"{path} failed on {len(failed)} of {len(live)} workers: " + "; ".join(failed))
        if not any(u not in self.stale for u in self.urls):
            raise RolloutError(f"{path}: no rollout worker answers ({', '.join(self.urls)})")
        return results

    def _skip(self, url: str, why: str, what: str) -> None:
        """Leave out a worker that does not answer, with one log line: it misses weight updates
        until it answers again (`rejoin`), and this client sends it no generation meanwhile."""
        if url not in self.stale:
            log.warning(
                "rollout worker %s does not answer (%s): skipped by %s and by weight updates until it "
                "answers again, then it loads the current weights", url, why, what,
            )  # fmt: skip
            self.stale.add(url)

    async def rejoin(self) -> list[str]:
        """Workers left out earlier that answer /health again load the newest weights (the newest
        update's payload) and take part again; returns them."""
        back = []
        probes = await asyncio.gather(*(self._get_status(u, "/health") for u in sorted(self.stale)))
        for url, status in probes:
            if status != 200:
                continue
            if self._weights is not None:
                ok, msg = (await self._update_one(url, "/update_weights_from_disk", self._weights))[1:]
                if not ok:
                    log.warning("rollout worker %s answers again but cannot load the weights: %s", url, msg)
                    continue
            self.stale.discard(url)
            back.append(url)
            version = None if self._weights is None else self._weights["weight_version"]
            log.warning("rollout worker %s answers again: rejoined at weight version %s", url, version)
        return back

    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str | None = None, pause: bool = False
    ) -> None:
        """Make every server load `model_path` and report `weight_version` from then on; raises
        naming the servers that failed. SGLang flushes its cache itself.

        Without `pause`, requests in flight are not aborted: each server finishes them under the
        old weights before it loads, holding new requests meanwhile (SGLang's update takes a
        writer lock that every request holds as a reader), so the update waits for the slowest.
        With `pause` (partial rollouts): every server is paused in mode "abort" (its requests in
        flight return the tokens sampled so far; this client sends their continuations after
        the continue), then every server loads, then every server continues;
        no server loads before all are paused, none continues before all have loaded, and all
        are continued whatever failed, so nothing is left paused."""
        if not pause:
            return await self._update_all(model_path, weight_version)
        try:
            await self.pause_generation("abort")
            await self._update_all(model_path, weight_version)
        finally:
            await self.continue_generation()

    async def _update_all(self, model_path: str, weight_version: str | None) -> None:
        payload = {"model_path": model_path, "abort_all_requests": False, "weight_version": weight_version}
        results = await asyncio.gather(
            *(self._update_one(u, "/update_weights_from_disk", payload) for u in self.urls)
        )
        failed = [f"{u}: {msg}" for u, ok, msg in results if ok is False]
        if failed:
            raise RolloutError(
                f"update_weights_from_disk({model_path}) failed on worker "
                + "; ".join(failed)
                + " (the run stops: its workers would serve different weights)"
            )
        if all(ok is None for _, ok, _ in results):
            detail = "; ".join(f"{u}: {msg}" for u, _, msg in results)
            raise RolloutError(f"update_weights_from_disk({model_path}): no worker answers ({detail})")
        self._weights = payload
        for u, ok, msg in results:
            if ok is None:
                self._skip(u, msg, f"the weight update to version {weight_version}")
            elif u in self.stale:
                self.stale.discard(u)
                log.warning("rollout worker %s answers again: rejoined at version %s", u, weight_version)

    async def _update_one(self, url: str, path: str, payload: dict[str, Any]) -> tuple[str, bool | None, str]:
        """(url, True when loaded / False when the worker answered with an error / None when it
        did not answer at all, message)."""
        try:
            async with self._get_session().post(url + path, json=payload) as resp:
                text = await resp.text()
                if resp.status != 200:
                    return url, False, f"HTTP {resp.status}: {text[:300]}"
                obj = await resp.json(content_type=None)
                return url, bool(obj.get("success", False)), str(obj.get("message", ""))
        except (TimeoutError, aiohttp.ClientConnectionError) as err:
            return url, None, f"{type(err).__name__}: {err}"
        except (aiohttp.ClientError, ValueError) as err:
            return url, False, f"{type(err).__name__}: {err}"

    async def flush_cache(self) -> None:
        """Drop every server's prefix cache (SGLang answers 400 while requests run; a weight
        update flushes by itself)."""
        await self._post_all("/flush_cache", None)

    async def pause_generation(self, mode: str = "abort") -> None:
        """Pause every server; mode "abort" returns the requests in flight as aborted (the call
        returns once they have), and this client continues them after `continue_generation`."""
        self._pauses += 1
        self._pausing = True
        await self._post_all("/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        """Continue every server; then the continuations of the requests a pause returned go out."""
        try:
            await self._post_all("/continue_generation", {})
        finally:
            self._pausing = False

    async def abort_request(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Cancel the request `rid` (or all of this client's): its `generate` raises RequestAborted."""
        if not abort_all and not rid:
            raise UserError("abort_request needs a rid or abort_all")
        self._cancelled.update(self._rids if abort_all else {rid} & self._rids)
        wire = self._wire.get(rid, rid) if rid else ""
        await self._post_all("/abort_request", {"rid": wire, "abort_all": abort_all})


def client_from_config(rollout: Any) -> RolloutClient:
    """A RolloutClient for the `rollout` section of a RunConfig (engine http or sglang)."""
    if not rollout.urls:
        raise UserError("rollout.urls: at least one server URL is needed for engine http/sglang")
    if rollout.router and rollout.router.rstrip("/") in [u.rstrip("/") for u in rollout.urls]:
        raise UserError(
            f"rollout.urls lists the router {rollout.router}: list the workers there (weight updates "
            "go to each; the router has no such route) and the router in rollout.router only"
        )
    return RolloutClient(
        rollout.urls,
        timeout=rollout.request_timeout_s,
        max_retries=rollout.max_retries,
        allow_biased_sampling=rollout.allow_biased_sampling,
        seed=rollout.seed,
        router=rollout.router,
    )
