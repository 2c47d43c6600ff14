"""Collection: the groups one RL iteration trains on, from a `RolloutPump` at any staleness k.

A group is G episodes of one problem, judged (rewards, advantages) only when all its episodes are
done. `draw` picks the next problems from the seeded data order and gives every episode its seed
from (run seed, the order before the draw, the problem's place in it, the sample); the order is in
every checkpoint, so a resumed run replays the same episodes.

k = 0 (rl.max_staleness 0, the paper's synchronous loop): nothing is sampled ahead. `take` draws
P problems under policy version step - 1, waits for every group, and with rl.resample_to_fill
draws the missing count again, up to rl.max_resample_rounds more rounds (DAPO's dynamic sampling).

k > 0 (asynchronous, partial rollouts): the pump keeps k x P groups outstanding (running, or done
and not yet taken) and starts a new group as soon as one is taken, so the engine never waits for
the trainer and the trainer never waits for the slowest episode. Weight updates do not stop
episodes: a running episode continues under the new weights from its next turn, and every sampled
token keeps the version that sampled it (`Trajectory.policy_versions`). `take` hands policy version
step - 1 finished groups until P of them are informative, within P x (1 + rounds) groups: of the
groups done, the first drawn; else the next to finish; then in draw order, so the batches depend
on timing only through which groups are done when it looks. A token more than k versions behind
the trainer is stale; how stale tokens train is rl.stale_tokens (jaxswe.rl.train).

With several JAX processes and k = 0 over HTTP servers (`Backend.spread`), every process runs the
pump: each round's episodes are spread over the processes (process p drives episodes p, p + n, ...
with its own client and sandboxes) and all-gathered, so every process judges the same groups and
trains on the same batches, and no one process drives them all. Otherwise (k > 0, or the embedded
sampler on process 0) the pump runs on process 0, like every other rollout (jaxswe.distributed),
and `take` broadcasts the judged groups.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from jaxswe.agent.episodes import collect_episodes
from jaxswe.agent.trajectory import Trajectory
from jaxswe.config import RunConfig
from jaxswe.distributed import on_main_async
from jaxswe.errors import UserError
from jaxswe.rl.inputs import RLRun
from jaxswe.rl.problems import DataOrder, next_problems
from jaxswe.rl.rewards import GroupResult, compute_group_advantages, shaped_rewards
from jaxswe.rollout.types import derive_seed


@dataclass
class Collected:
    """The judged groups one iteration trains from (`kept`: the ones it trains on)."""

    groups: list[list[Trajectory]]
    rewards: list[list[float]]
    result: GroupResult
    kept: list[bool]
    rounds: int = 0
    timings: Counter = field(default_factory=Counter)
    extra: dict[str, float] = field(default_factory=dict)  # k > 0: staleness metrics
    min_version: int | None = None  # k > 0: tokens of older policy versions are stale


def group_rewards(group: list[Trajectory], cfg: RunConfig) -> list[float]:
    """Shaped rewards (outcome + turn penalty) of one group's episodes."""
    return shaped_rewards(
        np.array([e.resolved for e in group]),
        np.array([e.num_turns for e in group]),
        threshold=cfg.rl.turn_penalty_threshold,
        max_turns=cfg.agent.max_turns,
    ).tolist()


def judge(
    groups: list[list[Trajectory]], rewards: list[list[float]], scale_by_std: bool = True
) -> GroupResult:
    """Advantages and kept groups (which groups are kept does not depend on `scale_by_std`)."""
    infra = [[e.infra_error is not None for e in g] for g in groups]
    return compute_group_advantages(rewards, infra, scale_by_std=scale_by_std)


def infra_health(rl_run: RLRun) -> dict[str, int]:
    """What is down now: rollout workers left out of weight updates (they do not answer) and
    sandbox engines of the pool that do not answer (0 when there is no pool or no worker list)."""
    stale = getattr(rl_run.backend.engine, "stale", ())
    from envs.engines import default_pool

    pool = default_pool() if rl_run.cfg.env.backend == "docker" else None
    down = sum(not healthy for _, _, healthy in pool.load().values()) if pool is not None else 0
    return {"rollout_workers_left_out": len(stale), "sandbox_engines_down": down}


def first_kept(kept: list[bool], limit: int) -> list[bool]:
    """DAPO's dynamic sampling trains on at most `limit` informative groups (the first ones)."""
    first = set([i for i, k in enumerate(kept) if k][:limit])
    return [i in first for i in range(len(kept))]


def draw(cfg: RunConfig, task_ids: list[str], count: int, order: DataOrder):
    """(the next `count` problems, each one's G episode seeds, the advanced order)."""
    problems, after = next_problems(task_ids, count, order, cfg.seed)
    at = (order.epoch, order.cursor)
    group = range(cfg.rl.group_size)
    seeds = [[derive_seed(cfg.seed, "rl", at, j, s) for s in group] for j in range(len(problems))]
    return problems, seeds, after


def sampled_versions(group: list[Trajectory]) -> np.ndarray:
    """The policy version of every sampled token of `group`'s scored episodes."""
    return np.array(
        [
            v
            for e in group
            if e.infra_error is None
            for v, m in zip(e.policy_versions, e.loss_mask, strict=True)
            if m
        ],  # fmt: skip
        np.int64,
    )


def check_versioned(group: list[Trajectory]) -> None:
    """Raise when a sampled token of `group` has no policy version (the engine reported none):
    with k > 0 it could never be told fresh from stale."""
    if (sampled_versions(group) < 0).any():
        raise UserError(
            "rl.max_staleness > 0 needs the policy version of every sampled token, and the rollout "
            "engine reported none (meta_info.weight_version); use an engine that reports it "
            "(jaxswe serve, or an SGLang whose /generate meta_info has weight_version) or rl.max_staleness 0"
        )


def trains(versions: np.ndarray, min_version: int, stale_tokens: str) -> np.ndarray:
    """Which of one trajectory's sampled tokens (their policy `versions`) train when `min_version`
    is the oldest fresh version, by rl.stale_tokens: "drop" the fresh ones; "trajectory" all of
    them when all are fresh, else none; "keep" all (the loss's importance weights correct them)."""
    fresh = versions >= min_version
    if stale_tokens == "drop":
        return fresh
    if stale_tokens == "trajectory":
        return np.full_like(fresh, fresh.all())
    return np.ones_like(fresh)


def _trained(group: list[Trajectory], min_version: int, stale_tokens: str):
    """(sampled versions, which train) of each scored episode of `group`."""
    for e in group:
        if e.infra_error is None:
            versions = sampled_versions([e])
            yield versions, trains(versions, min_version, stale_tokens)


def trainable(group: list[Trajectory], min_version: int, stale_tokens: str = "drop") -> bool:
    """Whether any sampled token of `group` trains (see `trains`)."""
    return any(t.any() for _, t in _trained(group, min_version, stale_tokens))


def staleness_stats(
    groups: list[list[Trajectory]], kept: list[bool], version: int, k: int, stale_tokens: str = "drop"
) -> dict[str, Any]:
    """Staleness of the kept groups' sampled tokens behind the trainer's `version`: of those that
    train (`trains`), the mean and max lag and the fraction at each lag 0..k; the fraction that
    does not train (`staleness_masked_frac`), and the kept groups' scored trajectories of which
    nothing trains (`trajectories_stale`: typically the quick episodes of a group that waited for
    a straggler)."""
    trained_lags, untrained, total, stale = [np.zeros(0, np.int64)], 0, 0, 0
    for g in (g for g, keep in zip(groups, kept, strict=True) if keep):
        for versions, t in _trained(g, version - k, stale_tokens):
            trained_lags.append(version - versions[t])
            untrained, total, stale = untrained + int((~t).sum()), total + t.size, stale + (not t.any())
    lags = np.concatenate(trained_lags)
    out: dict[str, Any] = {
        "staleness_mean": float(lags.mean()) if lags.size else 0.0,
        "staleness_max": int(lags.max()) if lags.size else 0,
        "staleness_masked_frac": untrained / total if total else 0.0,
        "trajectories_stale": stale,
    }
    for lag in range(k + 1):
        out[f"staleness_frac_{lag}"] = float((lags == lag).mean()) if lags.size else 0.0
    return out


class RolloutPump:
    """Groups of episodes, drawn in order and run on the rollout engine; `take` is an iteration's
    collection (see the module doc)."""

    def __init__(self, rl_run: RLRun, order: DataOrder):
        rl = rl_run.cfg.rl
        self.rl_run = rl_run
        self.order = order  # drawn ahead of training: includes the problems of outstanding groups
        self.capacity = rl.max_staleness * rl.problems_per_iteration  # groups sampled ahead
        self.outstanding = 0
        self.drawn = 0  # groups started so far: a group's draw index orders the finished ones
        self.taken = 0  # groups handed to the trainer so far
        self.finished: dict[int, list[Trajectory]] = {}
        self.tasks: set[asyncio.Task] = set()
        self.changed = asyncio.Event()
        self.error: BaseException | None = None
        # k = 0 over servers every process reaches: every process runs the pump, driving its share
        self.spread = rl.max_staleness == 0 and rl_run.backend.spread and jax.process_count() > 1

    def _fill(self) -> None:
        while self.outstanding < self.capacity:
            self._start(1)

    def _start(self, count: int) -> None:
        """Draw `count` problems and run their groups as one collection."""
        problems, seeds, self.order = draw(self.rl_run.cfg, self.rl_run.task_ids, count, self.order)
        self.outstanding += len(problems)
        run = self._run(self.drawn, problems, seeds)
        self.drawn += len(problems)
        task = asyncio.get_running_loop().create_task(run)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, first: int, problems: list[str], seeds: list[list[int]]) -> None:
        cfg, g = self.rl_run.cfg, self.rl_run.cfg.rl.group_size
        try:
            episodes, _ = await collect_episodes(
                [p for p in problems for _ in range(g)],
                self.rl_run.make_env,
                self.rl_run.backend.engine,
                self.rl_run.tokenizer,
                self.rl_run.sampling,
                cfg.agent,
                concurrency=cfg.env.max_parallel,
                every_process=False,  # `take` broadcasts the groups it hands the trainer
                spread=self.spread,  # or every process runs `take`, each driving its share
                seeds=[s for group in seeds for s in group],
            )
            for j in range(len(problems)):
                self.finished[first + j] = episodes[j * g : (j + 1) * g]
        except asyncio.CancelledError:
            raise
        except Exception as err:  # surfaces in the trainer's next take
            self.error = err
        self.changed.set()

    async def _next_group(self) -> tuple[int, list[Trajectory]]:
        """(draw index, episodes) of the first drawn of the groups done (waits for one if none is)."""
        while not self.finished:
            if self.error is not None:
                raise self.error
            self.changed.clear()
            await self.changed.wait()
        self.outstanding -= 1
        self.taken += 1
        self._fill()
        index = min(self.finished)
        return index, self.finished.pop(index)

    async def take(self, step: int) -> tuple[Collected, DataOrder]:
        """The judged groups policy version step - 1 trains on, and the data order after them
        (ahead by the outstanding groups' problems), on every process."""
        if self.spread:
            return await self._take(step)
        return await on_main_async(lambda: self._take(step))

    async def _take(self, step: int) -> tuple[Collected, DataOrder]:
        """`take` on process 0 (the others receive its broadcast), or on every process (`spread`)."""
        self._fill()  # the first take starts the k x P groups sampled ahead
        cfg, rl = self.rl_run.cfg, self.rl_run.cfg.rl
        version, k, want = step - 1, rl.max_staleness, rl.problems_per_iteration
        extra_rounds = rl.max_resample_rounds if rl.resample_to_fill else 0
        t0 = time.perf_counter()
        drawn, groups, rewards, fresh = [], [], [], []
        rounds = 0
        while True:
            if k == 0:  # synchronous: sample the missing groups now, all by the newest version
                self._start(want - sum(judge(groups, rewards).kept))
                rounds += 1
            while True:  # k = 0: the whole round; k > 0: the next group
                index, group = await self._next_group()
                if k:
                    check_versioned(group)
                drawn.append(index)
                groups.append(group)
                rewards.append(group_rewards(group, cfg))
                fresh.append(k == 0 or trainable(group, version - k, rl.stale_tokens))
                if k or not self.outstanding:
                    break
            kept = [a and b for a, b in zip(judge(groups, rewards).kept, fresh, strict=True)]
            spent = rounds > extra_rounds if k == 0 else len(groups) >= want * (1 + extra_rounds)
            if sum(kept) >= want or spent:
                break
        by_draw = np.argsort(drawn)  # in draw order, whichever finished first
        groups, rewards, fresh = ([xs[i] for i in by_draw] for xs in (groups, rewards, fresh))
        result = judge(groups, rewards, rl.advantage_std)
        kept = first_kept([a and b for a, b in zip(result.kept, fresh, strict=True)], want)
        timings = Counter(
            time_rollout_s=time.perf_counter() - t0,
            time_grading_s=sum(e.grading_s for g in groups for e in g),  # summed over parallel episodes
        )
        resampled = rounds - 1 if k == 0 else max(0, -(-len(groups) // want) - 1)
        health = infra_health(self.rl_run)
        if k == 0:
            return Collected(groups, rewards, result, kept, resampled, timings, health), self.order
        stats = staleness_stats(groups, kept, version, k, rl.stale_tokens)
        extra = {"groups_stale": len(fresh) - sum(fresh), **stats, **health}
        return Collected(groups, rewards, result, kept, resampled, timings, extra, version - k), self.order

    async def stop(self) -> dict[str, int]:
        """Cancel the outstanding episodes (a resumed run starts new ones); returns the episode
        count of this pump: drawn, and drawn but never handed to the trainer (cancelled running,
        or finished after the last take), so every episode drawn is accounted for."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        g = self.rl_run.cfg.rl.group_size
        return {"episodes_drawn": self.drawn * g, "episodes_not_taken": (self.drawn - self.taken) * g}
