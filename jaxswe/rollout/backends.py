"""Rollout backends: the engine a stage samples from, and how new weights reach it.

Two backends: the embedded in-process sampler (weights swapped in memory) and HTTP servers
speaking SGLang's API (`jaxswe serve` or SGLang; weights exported with `save_hf` and loaded by
`/update_weights_from_disk`). Each weight sync names its policy version (the RL iterations
trained into the weights; 0 is the starting policy), which the engine stamps on every token it
samples from then on.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import jax

from jaxswe.distributed import barrier, broadcast, is_main, to_host
from jaxswe.rollout.types import Engine
from jaxswe.run import loops

T = TypeVar("T")


class Backend(Protocol):
    engine: Engine
    spread: bool  # every process can drive episodes on `engine` (collect_episodes' `spread`)

    async def sync_weights(self, params: Any, export_dir: Path, *, version: int) -> None: ...

    async def release(self) -> None:
        """Drop what is bound to the current event loop (HTTP sessions)."""

    async def close(self) -> None: ...


def run_phase(backend: Backend, coro: Awaitable[T]) -> T:
    """Run one async phase (its own event loop) and release the backend's loop-bound state."""

    async def main() -> T:
        try:
            return await coro
        finally:
            await backend.release()

    return loops.run(main())


def sampler_copy(params: Any) -> Any:
    """The embedded sampler's own copy of (possibly multi-process, sharded) params: whole, on this
    process's first device. Every process must call it (it gathers across processes); the same
    device for any mesh, so a run samples the same tokens for any device or process count."""
    device = jax.local_devices()[0]
    return jax.tree.map(lambda x: jax.device_put(to_host(x), device), params)


class EmbeddedBackend:
    """The in-process sampler (on process 0 only: `engine` is None elsewhere); new weights are
    swapped in memory (no disk round trip)."""

    spread = False

    def __init__(self, engine: Any, model_cfg: Any):
        self.engine = engine
        self.model_cfg = model_cfg

    async def sync_weights(self, params: Any, export_dir: Path, *, version: int) -> None:
        local = sampler_copy(params)
        if self.engine is not None:
            await self.engine.swap_weights(self.model_cfg, local, weight_version=str(version))

    async def release(self) -> None:
        return None

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()


class HttpBackend:
    """SGLang-API servers; weights go through `save_hf` on a shared disk, in `export_dtype`.

    With `partial_rollouts` (rl.max_staleness > 0: episodes are in flight at every sync) the
    servers are paused for the update and continued after it (`RolloutClient.
    update_weights_from_disk(pause=True)`): a request in flight returns its tokens so far and its
    continuation is sampled by the new weights, so a sync never waits for the slowest generation
    and no worker serves old weights after another has loaded new ones. The other way SGLang
    allows, an update that waits for the requests in flight, would hold every server (and new
    requests) until the longest generation ends, and leave workers on different versions
    meanwhile. Without it (the synchronous loop) nothing is in flight and the update is a plain
    `/update_weights_from_disk`.
    """

    spread = True  # every process has a client of the same servers

    def __init__(
        self,
        client: Any,
        model_cfg: Any,
        tokenizer_dir: str | None,
        *,
        export_dtype: str = "bfloat16",
        partial_rollouts: bool = False,
    ):
        self.engine = client
        self.model_cfg = model_cfg
        self.tokenizer_dir = tokenizer_dir
        self.export_dtype = export_dtype
        self.partial_rollouts = partial_rollouts

    async def sync_weights(self, params: Any, export_dir: Path, *, version: int) -> None:
        """Every process writes its own layers; process 0 then tells every worker to load them."""
        from jaxswe.model import save_hf

        tmp = export_dir.with_name(export_dir.name + ".tmp")
        if is_main():
            shutil.rmtree(tmp, ignore_errors=True)
        barrier("weights export")
        # in a thread: with rl.max_staleness > 0 episodes keep running during the export
        await asyncio.to_thread(save_hf, tmp, self.model_cfg, params, dtype=self.export_dtype)
        from jaxswe.rollout.client import RolloutError

        error = None
        if is_main():
            try:
                await self._publish(tmp, export_dir, version)
            except RolloutError as err:  # a worker failed the update: every process stops
                error = str(err)
        error = broadcast(error)
        if error:
            raise RolloutError(error)

    async def _publish(self, tmp: Path, export_dir: Path, version: int) -> None:
        if self.tokenizer_dir:
            for f in Path(self.tokenizer_dir).iterdir():
                if f.is_file() and ("token" in f.name or f.name in ("vocab.json", "merges.txt")):
                    shutil.copy2(f, tmp / f.name)
        shutil.rmtree(export_dir, ignore_errors=True)
        tmp.rename(export_dir)
        # the server flushes its cache itself
        await self.engine.update_weights_from_disk(
            str(export_dir.absolute()), weight_version=str(version), pause=self.partial_rollouts
        )

    async def release(self) -> None:
        await self.engine.close()

    async def close(self) -> None:
        await self.engine.close()
