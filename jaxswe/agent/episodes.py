"""Collecting episodes: one per task id, all in flight at once on a rollout engine, on one process
or spread over every process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import jax

from envs.base import Environment
from jaxswe.agent.loop import episode_seeds, run_episodes
from jaxswe.agent.trajectory import Trajectory
from jaxswe.config import AgentSection
from jaxswe.distributed import allgather_objects, on_main_async
from jaxswe.rollout.types import Engine, SamplingParams


class EnvFactory(Protocol):
    """(task id, episode seed) -> a fresh environment for one episode. A random environment (the
    toy game) draws from the seed alone, so an episode replays exactly from its seed."""

    def __call__(self, task_id: str, seed: int | None = None) -> Environment: ...


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
