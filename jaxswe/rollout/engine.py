"""`EmbeddedEngine`: an in-process `Engine` that batches concurrent requests onto one `Sampler`.

Requests arriving within `batch_wait_s` of each other (up to `max_batch`) run as one batch on a
single worker thread, so the event loop stays responsive. With `batch_invariant` (the stages' default,
`rollout.deterministic_inference`) a batch holds only requests of one padded shape
(`Sampler.shape_key`, the oldest waiting request's first) on a sampler whose batch size is fixed, so
every request's tokens and log-probs are bit for bit those it gets alone: they do not depend on
timing, load or how many requests are in flight. The control operations follow SGLang
0.5.x:
- `update_weights_from_disk` loads the new model beside the old one (if loading fails the old
  model stays), then, unless generation is paused, holds new requests back until every request
  in flight has finished and swaps the weights in (so no response mixes two versions); when
  paused it swaps at once. `abort_all_requests` aborts what is in flight first.
- `pause("abort")` aborts every request in flight (each returns the tokens sampled so far with
  finish_reason "abort"), returns once all of them have returned (SGLang's pause waits until no
  request holds its model-update reader lock), and holds new requests until `continue_generation`.
- `abort(rid)` / `abort(abort_all=True)` aborts requests; a running one stops at the next decode
  chunk boundary.
Every result carries the weight version that produced it (SGLang's `meta_info.weight_version`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from jaxswe.rollout.protocol import GenerateRequest, ProtocolError
from jaxswe.rollout.sampler import Sampler
from jaxswe.rollout.types import Generation, SamplingParams

PAUSE_MODES = ("abort",)  # SGLang's "retract" and "in_place" keep requests across an update


@dataclass(eq=False)
class _Job:
    req: GenerateRequest
    fut: asyncio.Future
    aborted: bool = False  # read by the sampler thread between decode chunks
    running: bool = False


@dataclass
class _Control:
    paused: bool = False
    updating: bool = False  # an update waits for the requests in flight to finish
    jobs: set[_Job] = field(default_factory=set)


class EmbeddedEngine:
    """Async front of a `Sampler`; `load_fn(path) -> (cfg, params)` serves weight updates."""

    def __init__(
        self,
        sampler: Sampler,
        *,
        load_fn: Callable[[str], tuple[Any, Any]] | None = None,
        model_path: str | None = None,
        max_batch: int = 16,
        batch_wait_s: float = 0.005,
        weight_version: str = "default",
        batch_invariant: bool = False,
    ):
        if batch_invariant and sampler.min_batch_bucket < max_batch:
            raise ValueError(
                f"batch_invariant needs the sampler's batch size fixed: min_batch_bucket "
                f"{sampler.min_batch_bucket} < max_batch {max_batch}"
            )
        self.sampler = sampler
        self.batch_invariant = batch_invariant
        self.load_fn = load_fn
        self.model_path = model_path
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.weight_version = weight_version
        self.batches_run = 0
        self._ctl = _Control()
        self._queue: asyncio.Queue[_Job] | None = None
        self._waiting: list[_Job] = []  # taken from the queue, not yet run (oldest first)
        self._worker: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None  # held while a batch runs or weights are swapped
        self._cond: asyncio.Condition | None = None  # signals pause/update/in-flight changes
        self._update_lock: asyncio.Lock | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler")

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._queue = asyncio.Queue()
            self._waiting = []
            self._lock = asyncio.Lock()
            self._cond = asyncio.Condition()
            self._update_lock = asyncio.Lock()  # one weight update at a time
            self._ctl = _Control(paused=self._ctl.paused)
            self._worker = asyncio.get_running_loop().create_task(self._run())

    @property
    def paused(self) -> bool:
        return self._ctl.paused

    @property
    def num_in_flight(self) -> int:
        return len(self._ctl.jobs)

    async def generate(
        self, input_ids: list[int], params: SamplingParams, *, logprob_start_len: int = -1
    ) -> Generation:
        req = GenerateRequest(list(input_ids), params, logprob_start_len >= 0, logprob_start_len)
        gen, version = (await self.submit([req]))[0]
        return replace(gen, weight_versions=[version] * len(gen.output_ids))

    async def submit(self, requests: list[GenerateRequest]) -> list[tuple[Generation, str]]:
        """Queue requests (validated first, so a bad one fails alone) and await their results,
        each with the weight version that produced it. Waits while paused or updating."""
        for req in requests:
            self.sampler.validate(req)
        self._ensure_worker()
        async with self._cond:
            await self._cond.wait_for(lambda: not (self._ctl.paused or self._ctl.updating))
            busy = {j.req.rid for j in self._ctl.jobs} & {r.rid for r in requests if r.rid}
            if busy:
                raise ProtocolError(f"rid {sorted(busy)[0]!r} is already in flight")
            loop = asyncio.get_running_loop()
            jobs = [_Job(req, loop.create_future()) for req in requests]
            self._ctl.jobs.update(jobs)
        try:
            for job in jobs:
                self._queue.put_nowait(job)
            return list(await asyncio.gather(*(job.fut for job in jobs)))
        finally:
            async with self._cond:
                self._ctl.jobs.difference_update(jobs)
                self._cond.notify_all()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if not batch:
                continue
            async with self._lock:
                for job in batch:
                    job.running = True
                try:
                    gens = await loop.run_in_executor(self._executor, self._run_batch, batch)
                except Exception as err:  # one failed batch fails its callers, not the server
                    for job in batch:
                        if not job.fut.done():
                            job.fut.set_exception(err)
                    continue
                self.batches_run += 1
                for job, gen in zip(batch, gens, strict=True):  # under the lock: no swap in between
                    if not job.fut.done():
                        job.fut.set_result((gen, self.weight_version))

    async def _next_batch(self) -> list[_Job]:
        """The oldest waiting request and, up to `max_batch`, the others waiting (with
        `batch_invariant`, those of its shape only; the rest wait for the next batches, in order)."""
        if not self._waiting:
            self._waiting.append(await self._queue.get())
            await asyncio.sleep(self.batch_wait_s)  # let concurrent requests join this batch
        while not self._queue.empty():
            self._waiting.append(self._queue.get_nowait())
        waiting = [j for j in self._waiting if not j.fut.done()]  # aborted while queued, or cancelled
        if not waiting:
            self._waiting = []
            return []
        key = self._shape(waiting[0])
        batch = [j for j in waiting if self._shape(j) == key][: self.max_batch]
        chosen = set(map(id, batch))
        self._waiting = [j for j in waiting if id(j) not in chosen]
        return batch

    def _shape(self, job: _Job) -> tuple[int, int] | None:
        return self.sampler.shape_key(job.req) if self.batch_invariant else None

    def _run_batch(self, batch: list[_Job]) -> list[Generation]:
        return self.sampler.generate([j.req for j in batch], aborted=lambda i: batch[i].aborted)

    # -- control -------------------------------------------------------------------------------
    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Abort the request `rid` (or all in flight); unknown ids are ignored, as in SGLang."""
        for job in self._ctl.jobs:
            if abort_all or (rid is not None and job.req.rid == rid):
                job.aborted = True
                if not job.running and not job.fut.done():  # still queued: nothing sampled yet
                    job.fut.set_result((Generation([], [], "abort"), self.weight_version))

    async def pause(self, mode: str = "abort") -> int:
        """Hold new requests until `continue_generation`; mode "abort" aborts those in flight and
        returns (how many it aborted) once every one of them has returned."""
        if mode not in PAUSE_MODES:
            raise ProtocolError(f"pause mode {mode!r} is not supported by jaxswe serve (use {PAUSE_MODES})")
        self._ensure_worker()
        async with self._cond:
            self._ctl.paused = True
            aborted = len(self._ctl.jobs)
            self.abort(abort_all=True)
            await self._cond.wait_for(lambda: not self._ctl.jobs)
        return aborted

    async def continue_generation(self) -> None:
        self._ensure_worker()
        async with self._cond:
            self._ctl.paused = False
            self._cond.notify_all()

    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str | None = None, abort_all_requests: bool = False
    ) -> None:
        """Load `model_path` and swap it in (see the module doc); raises (old weights kept) on failure."""
        if self.load_fn is None:
            raise RuntimeError("this engine was built without a load_fn")
        self._ensure_worker()
        async with self._update_lock:
            await self._update(model_path, weight_version, abort_all_requests)

    async def _update(self, model_path: str, weight_version: str | None, abort_all_requests: bool) -> None:
        if abort_all_requests:
            self.abort(abort_all=True)
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            cfg, params = await loop.run_in_executor(pool, self.load_fn, model_path)
        async with self._cond:
            self._ctl.updating = True
            try:
                await self._cond.wait_for(lambda: self._ctl.paused or not self._ctl.jobs)
                async with self._lock:
                    self.sampler.swap(cfg, params)
                    self.model_path = model_path
                    if weight_version is not None:
                        self.weight_version = weight_version
            finally:
                self._ctl.updating = False
                self._cond.notify_all()

    async def swap_weights(self, cfg: Any, params: Any, *, weight_version: str) -> None:
        """Swap in-memory weights between two batches: requests in flight keep running, and each
        result is stamped with the version that sampled it (the trainer's in-process sync)."""
        self._ensure_worker()
        async with self._lock:
            self.sampler.swap(cfg, params)
            self.weight_version = weight_version

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        self._executor.shutdown(wait=False, cancel_futures=True)
