"""Running episodes on a rollout engine, and handing new weights to that engine.

Two backends: the embedded in-process sampler (weights swapped in memory) and HTTP servers
speaking SGLang's API (`jaxswe serve` or SGLang; weights exported with `save_hf` and loaded by
`/update_weights_from_disk`).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from envs.base import Environment
from jaxswe.config import AgentSection
from jaxswe.rollout.types import Engine, SamplingParams
from jaxswe.stages.episodes import Episode, from_trajectory

EnvFactory = Callable[[str], Environment]
T = TypeVar("T")


class Backend(Protocol):
    engine: Engine

    async def sync_weights(self, params: Any, export_dir: Path) -> None: ...

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

    return asyncio.run(main())


class EmbeddedBackend:
    """The in-process sampler; new weights are swapped in memory (no disk round trip)."""

    def __init__(self, engine: Any, model_cfg: Any):
        self.engine = engine
        self.model_cfg = model_cfg

    async def sync_weights(self, params: Any, export_dir: Path) -> None:
        self.engine.sampler.swap(self.model_cfg, params)

    async def release(self) -> None:
        return None

    async def close(self) -> None:
        await self.engine.close()


class HttpBackend:
    """SGLang-API servers; weights go through `save_hf` on a shared disk."""

    def __init__(self, client: Any, model_cfg: Any, tokenizer_dir: str | None):
        self.engine = client
        self.model_cfg = model_cfg
        self.tokenizer_dir = tokenizer_dir

    async def sync_weights(self, params: Any, export_dir: Path) -> None:
        from jaxswe.model import save_hf

        tmp = export_dir.with_name(export_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_hf(tmp, self.model_cfg, params)
        if self.tokenizer_dir:
            for f in Path(self.tokenizer_dir).iterdir():
                if f.is_file() and ("token" in f.name or f.name in ("vocab.json", "merges.txt")):
                    shutil.copy2(f, tmp / f.name)
        shutil.rmtree(export_dir, ignore_errors=True)
        tmp.rename(export_dir)
        await self.engine.update_weights_from_disk(str(export_dir.absolute()))
        await self.engine.flush_cache()

    async def release(self) -> None:
        await self.engine.close()

    async def close(self) -> None:
        await self.engine.close()


async def collect_episodes(
    task_ids: list[str],
    make_env: EnvFactory,
    engine: Engine,
    tokenizer: Any,
    sampling: SamplingParams,
    agent: AgentSection,
    *,
    concurrency: int = 8,
    on_done: Callable[[int, Episode], None] | None = None,
) -> tuple[list[Episode], float]:
    """Run one episode per entry of `task_ids` (repeat an id for a group), all in flight at once.

    Returns the episodes in input order and the wall time; `on_done(index, episode)` is called as
    each one finishes (to stream them to disk). An environment that cannot even be built counts as
    an infrastructure failure of that episode.
    """
    from jaxswe.agent.loop import run_episodes

    start = time.perf_counter()
    envs: list[Environment | None] = []
    failures: dict[int, str] = {}
    for i, task in enumerate(task_ids):
        try:
            envs.append(make_env(task))
        except Exception as err:  # sandbox could not start: infra, not the policy's fault
            failures[i] = f"{type(err).__name__}: {err}"
            envs.append(None)
    live = [e for e in envs if e is not None]
    live_index = [i for i, e in enumerate(envs) if e is not None]
    if on_done is not None:
        for i, error in failures.items():
            on_done(i, _failed(task_ids[i], error))
    trajs = await run_episodes(
        live,
        engine,
        tokenizer,
        sampling=sampling,
        max_turns=agent.max_turns,
        max_context_tokens=agent.max_context_tokens,
        concurrency=concurrency,
        on_done=None
        if on_done is None
        else lambda j, traj: on_done(live_index[j], from_trajectory(task_ids[live_index[j]], traj)),
    )
    it = iter(trajs)
    episodes = []
    for i, task in enumerate(task_ids):
        episodes.append(_failed(task, failures[i]) if i in failures else from_trajectory(task, next(it)))
    return episodes, time.perf_counter() - start


def _failed(task: str, error: str) -> Episode:
    return Episode(task, [], [], [], [], 0, "error", False, infra_error=error)
