"""`EmbeddedEngine`: an in-process `Engine` that batches concurrent requests onto one `Sampler`.

Requests arriving within `batch_wait_s` of each other (up to `max_batch`) run as one batch on a
single worker thread, so the event loop stays responsive. A weight update loads the new model
beside the old one, then swaps it in between two batches; if loading fails the old model stays.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable
from typing import Any

from jaxswe.rollout.protocol import GenerateRequest
from jaxswe.rollout.sampler import Sampler
from jaxswe.rollout.types import Generation, SamplingParams


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
    ):
        self.sampler = sampler
        self.load_fn = load_fn
        self.model_path = model_path
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.batches_run = 0
        self._queue: asyncio.Queue[tuple[GenerateRequest, asyncio.Future]] | None = None
        self._worker: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler")

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._queue = asyncio.Queue()
            self._lock = asyncio.Lock()
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def generate(
        self, input_ids: list[int], params: SamplingParams, *, logprob_start_len: int = -1
    ) -> Generation:
        req = GenerateRequest(list(input_ids), params, logprob_start_len >= 0, logprob_start_len)
        return (await self.submit([req]))[0]

    async def submit(self, requests: list[GenerateRequest]) -> list[Generation]:
        """Queue requests (validated first, so a bad one fails alone) and await their results."""
        for req in requests:
            self.sampler.validate(req)
        self._ensure_worker()
        loop = asyncio.get_running_loop()
        futures = []
        for req in requests:
            fut = loop.create_future()
            await self._queue.put((req, fut))
            futures.append(fut)
        return list(await asyncio.gather(*futures))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(self.batch_wait_s)  # let concurrent requests join this batch
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [(r, f) for r, f in batch if not f.done()]  # drop cancelled callers
            if not batch:
                continue
            async with self._lock:
                try:
                    gens = await loop.run_in_executor(
                        self._executor, self.sampler.generate, [r for r, _ in batch]
                    )
                except Exception as err:  # one failed batch fails its callers, not the server
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(err)
                    continue
                self.batches_run += 1
            for (_, fut), gen in zip(batch, gens, strict=True):
                if not fut.done():
                    fut.set_result(gen)

    async def update_weights_from_disk(self, model_path: str) -> None:
        """Load `model_path` and swap it in between batches; raises (old weights kept) on failure."""
        if self.load_fn is None:
            raise RuntimeError("this engine was built without a load_fn")
        self._ensure_worker()
        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            cfg, params = await loop.run_in_executor(pool, self.load_fn, model_path)
        async with self._lock:
            self.sampler.swap(cfg, params)
            self.model_path = model_path

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        self._executor.shutdown(wait=False, cancel_futures=True)
