"""Running episodes on a rollout engine, and handing new weights to that engine.

Two backends: the embedded in-process sampler (weights swapped in memory) and HTTP servers
speaking SGLang's API (`jaxswe serve` or SGLang; weights exported with `save_hf` and loaded by
`/update_weights_from_disk`). Each weight sync names its policy version (the RL iterations
trained into the weights; 0 is the starting policy), which the engine stamps on every token it
samples from then on.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import jax

from envs.base import Environment
from jaxswe.agent.loop import episode_seeds, run_episodes
from jaxswe.agent.trajectory import Trajectory
from jaxswe.config import AgentSection
from jaxswe.distributed import allgather_objects, barrier, broadcast, is_main, on_main_async, to_host
from jaxswe.rollout.types import Engine, SamplingParams
from jaxswe.run import loops

T = TypeVar("T")


class EnvFactory(Protocol):
    """(task id, episode seed) -> a fresh environment for one episode. A random environment (the
    toy game) draws from the seed alone, so an episode replays exactly from its seed."""

    def __call__(self, task_id: str, seed: int | None = None) -> Environment: ...


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


async def collect_episodes(
    task_ids: list[str],
    make_env: EnvFactory,
    engine: Engine,
    tokenizer: Any,
    sampling: SamplingParams,
    agent: AgentSection,
    *,
    concurrency: int = 8,
    on_done: Callable[[int, Trajectory], None] | None = None,
    every_process: bool = True,
    spread: bool = False,
    seeds: list[int] | None = None,
) -> tuple[list[Trajectory], float]:
    """Run one episode per entry of `task_ids` (repeat an id for a group), all in flight at once.
    `seeds` are the episodes' own seeds (sampling and environment); by default they follow
    `sampling.sampling_seed`, the task id and which sample of the task each is.

    Returns the episodes in input order and the wall time; `on_done(index, episode)` is called as
    each one finishes (to stream them to disk). An environment that cannot even be built counts as
    an infrastructure failure of that episode. With several processes, process 0 runs them all and
    every process gets its episodes (see jaxswe.distributed); with `every_process` False only the
    calling process (process 0: its engine) runs them and gets them, with no collective. With
    `spread` (every process calls, each with its own engine client and sandboxes) process p drives
    episodes p, p + n, p + 2n, ... and every process gets all of them (all-gathered); `on_done`
    then sees the calling process's own. An episode's tokens follow its seed, not the process that
    drives it, so the episodes are the same for any process count on an engine that honours seeds.
    """
    if seeds is None:
        seeds = episode_seeds(task_ids, sampling.sampling_seed)
    if len(seeds) != len(task_ids):
        raise ValueError(f"{len(seeds)} seeds for {len(task_ids)} episodes")

    def run(ids=task_ids, own_seeds=seeds):
        return _collect(ids, own_seeds, make_env, engine, tokenizer, sampling, agent, concurrency, on_done)

    if spread and jax.process_count() > 1:
        return await _collect_spread(task_ids, seeds, run)
    return await (on_main_async(run) if every_process else run())


async def _collect_spread(task_ids, seeds, run) -> tuple[list[Trajectory], float]:
    """collect_episodes' `spread`: this process's share, then every process's, all-gathered (a
    process whose share failed fails the collection on every process, naming it)."""
    start = time.perf_counter()
    n, me = jax.process_count(), jax.process_index()
    mine = range(me, len(task_ids), n)
    try:
        share = ("ok", (await run([task_ids[i] for i in mine], [seeds[i] for i in mine]))[0])
    except Exception as err:
        share = ("error", f"{type(err).__name__}: {err}")
    shares = allgather_objects(share)
    failed = [f"process {p}: {out}" for p, (status, out) in enumerate(shares) if status == "error"]
    if failed:
        raise RuntimeError("driving episodes failed on " + "; ".join(failed))
    episodes: list[Any] = [None] * len(task_ids)
    for p, (_, own) in enumerate(shares):
        for i, episode in zip(range(p, len(task_ids), n), own, strict=True):
            episodes[i] = episode
    return episodes, time.perf_counter() - start


async def _collect(task_ids, seeds, make_env, engine, tokenizer, sampling, agent, concurrency, on_done):
    """collect_episodes on one process (`on_done` streams from process 0 only)."""
    start = time.perf_counter()
    envs: list[Environment | None] = []
    failures: dict[int, str] = {}
    for i, task in enumerate(task_ids):
        try:
            envs.append(make_env(task, seeds[i]))
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
        seeds=[seeds[i] for i in live_index],
        on_done=None
        if on_done is None
        else lambda j, traj: on_done(live_index[j], _named(traj, task_ids[live_index[j]])),
    )
    it = iter(trajs)
    episodes = []
    for i, task in enumerate(task_ids):
        episodes.append(_failed(task, failures[i]) if i in failures else _named(next(it), task))
    return episodes, time.perf_counter() - start


def _named(traj: Trajectory, task: str) -> Trajectory:
    traj.task_id = task
    return traj


def _failed(task: str, error: str) -> Trajectory:
    return Trajectory(task_id=task, ended_by="error", infra_error=error)
