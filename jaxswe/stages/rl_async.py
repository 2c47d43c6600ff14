"""Asynchronous rollouts with bounded staleness (rl.max_staleness = k > 0) and partial rollouts.

A `RolloutPump` keeps k x P groups of G episodes outstanding (running, or finished and not yet
trained) and starts a new group as soon as the trainer takes one, so the rollout engine never
waits for the trainer and the trainer never waits for the slowest episode of an iteration: while
version v trains, the groups of the next k steps are sampled by version v - 1 or later. A group is
judged (rewards, advantages) only when all its episodes are done. Weight updates do not stop
episodes: a running episode continues under the new weights from its next turn, and every sampled
token keeps the policy version that sampled it (`Episode.policy_versions`).

`take(order, step)` hands the trainer (policy version step - 1) finished groups until P of them
are informative, within the synchronous loop's budget of P groups (P x (1 + rl.max_resample_rounds)
with rl.resample_to_fill): of the groups already done, the first drawn; else the next to finish.
So the trainer never waits for a straggler while another group is done, and which groups it trains
on depends on timing only through which are done when it looks, not through their finishing order
(which favours groups of short episodes); it trains on them in draw order. At the default budget
(P groups, the k x P outstanding with k = 1) every take is the P groups drawn during the previous
one, whatever their finishing order, so a run repeats exactly. A token sampled more than k
versions behind the trainer is not trained: a group's newer tokens train (a long episode that
spans several weight updates keeps its recent turns), and a group with no newer token is not
trained at all (`groups_stale`); every episode's outcome still counts in its group's advantages,
and the loss weighs each token by truncated importance sampling (rl.tis_correction, on for k > 0
unless set false). The row reports the staleness of the trained tokens (mean, max, fraction at
each lag 0..k), the fraction of the kept groups' sampled tokens left out as too stale
(`staleness_masked_frac`) and the trajectories left out whole (`trajectories_stale`), and
`time_rollout_s`, the time the trainer waited for groups.

The episodes share the event loop with the trainer, whose steps run in a worker thread. With
several JAX processes the pump runs on process 0, like every rollout (jaxswe.distributed), and
`take` broadcasts its judged groups, so every process trains on the same batches.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np

from jaxswe.distributed import is_main, on_main_async
from jaxswe.errors import UserError
from jaxswe.rollout.types import derive_seed
from jaxswe.stages.context import StageContext
from jaxswe.stages.episodes import Episode
from jaxswe.stages.rl import Collected, first_kept, group_rewards, judge
from jaxswe.stages.rollouts import collect_episodes
from jaxswe.stages.task_pool import DataOrder, next_problems


def sampled_versions(group: list[Episode]) -> np.ndarray:
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


def check_versioned(group: list[Episode]) -> None:
    """Raise when a sampled token of `group` has no policy version (the engine reported none):
    with k > 0 it could never be told fresh from stale, and would silently never train."""
    if (sampled_versions(group) < 0).any():
        raise UserError(
            "rl.max_staleness > 0 needs the policy version of every sampled token, and the rollout "
            "engine reported none (meta_info.weight_version); use an engine that reports it "
            "(jaxswe serve, or an SGLang whose /generate meta_info has weight_version) or rl.max_staleness 0"
        )


def trainable(group: list[Episode], min_version: int) -> bool:
    """Whether `group` has a sampled token from `min_version` or later (one that may train)."""
    return bool((sampled_versions(group) >= min_version).any())


def staleness_stats(groups: list[list[Episode]], kept: list[bool], version: int, k: int) -> dict[str, Any]:
    """Staleness of the kept groups' sampled tokens behind the trainer's `version`: of the trained
    ones (lag <= k: mean, max, fraction at each lag 0..k), the fraction not trained for being more
    than k behind (`staleness_masked_frac`), and the kept groups' scored trajectories left out
    whole, every sampled token too stale (`trajectories_stale`: typically the quick episodes of a
    group that waited for a straggler)."""
    chosen = [g for g, keep in zip(groups, kept, strict=True) if keep]
    lags = version - np.concatenate([sampled_versions(g) for g in chosen] or [np.zeros(0, np.int64)])
    trained = lags[lags <= k]
    out: dict[str, Any] = {
        "staleness_mean": float(trained.mean()) if trained.size else 0.0,
        "staleness_max": int(trained.max()) if trained.size else 0,
        "staleness_masked_frac": float((lags > k).mean()) if lags.size else 0.0,
        "trajectories_stale": sum(
            1 for g in chosen for e in g if e.infra_error is None and not trainable([e], version - k)
        ),
    }
    for lag in range(k + 1):
        out[f"staleness_frac_{lag}"] = float((trained == lag).mean()) if trained.size else 0.0
    return out


class RolloutPump:
    """Groups of episodes kept in flight continuously; `take` is the async loop's `collect`."""

    def __init__(self, ctx: StageContext, order: DataOrder):
        rl = ctx.cfg.rl
        self.ctx = ctx
        self.order = order  # drawn ahead of training: includes the problems of outstanding groups
        self.capacity = rl.max_staleness * rl.problems_per_iteration
        self.outstanding = 0
        self.drawn = 0  # groups started so far: a group's draw index orders the finished ones
        self.finished: dict[int, list[Episode]] = {}
        self.tasks: set[asyncio.Task] = set()
        self.changed = asyncio.Event()
        self.error: BaseException | None = None
        if is_main():  # the other processes only receive `take`'s broadcast
            self._fill()

    def _fill(self) -> None:
        cfg = self.ctx.cfg
        while self.outstanding < self.capacity:
            # the seed follows the data order's state, so a group's samples never depend on timing
            seed = derive_seed(cfg.seed, "rl-async", self.order.to_json())
            (problem,), self.order = next_problems(self.ctx.task_ids, 1, self.order, cfg.seed)
            self.outstanding += 1
            task = asyncio.get_running_loop().create_task(self._run_group(self.drawn, problem, seed))
            self.drawn += 1
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _run_group(self, index: int, problem: str, seed: int) -> None:
        ctx, cfg = self.ctx, self.ctx.cfg
        try:
            episodes, _ = await collect_episodes(
                [problem] * cfg.rl.group_size,
                ctx.make_env,
                ctx.backend.engine,
                ctx.tokenizer,
                replace(ctx.sampling, sampling_seed=seed),
                cfg.agent,
                concurrency=cfg.env.max_parallel,
                every_process=False,  # `take` broadcasts the groups it hands the trainer
            )
            self.finished[index] = episodes
        except asyncio.CancelledError:
            raise
        except Exception as err:  # surfaces in the trainer's next take
            self.error = err
        self.changed.set()

    async def _next_group(self) -> tuple[int, list[Episode]]:
        """(draw index, episodes) of the first drawn of the groups done (waits for one if none is)."""
        while not self.finished:
            if self.error is not None:
                raise self.error
            self.changed.clear()
            await self.changed.wait()
        self.outstanding -= 1
        self._fill()
        index = min(self.finished)
        return index, self.finished.pop(index)

    async def take(self, order: DataOrder, step: int) -> tuple[Collected, DataOrder]:
        """The judged groups policy version step - 1 trains on (see the module doc), on every
        process; `order` is replaced by the pump's own, which runs ahead by the outstanding groups."""
        return await on_main_async(lambda: self._take(step))

    async def _take(self, step: int) -> tuple[Collected, DataOrder]:
        cfg, rl = self.ctx.cfg, self.ctx.cfg.rl
        version, k, want = step - 1, rl.max_staleness, rl.problems_per_iteration
        budget = want * (1 + (rl.max_resample_rounds if rl.resample_to_fill else 0))
        t0 = time.perf_counter()
        drawn, groups, rewards, fresh = [], [], [], []
        while len(groups) < budget:
            index, group = await self._next_group()
            check_versioned(group)
            drawn.append(index)
            groups.append(group)
            rewards.append(group_rewards(group, cfg))
            fresh.append(trainable(group, version - k))
            kept = [a and b for a, b in zip(judge(groups, rewards).kept, fresh, strict=True)]
            if sum(kept) >= want:
                break
        # in draw order, whichever finished first: the batches do not depend on timing
        by_draw = np.argsort(drawn)
        groups, rewards, fresh = ([xs[i] for i in by_draw] for xs in (groups, rewards, fresh))
        result = judge(groups, rewards)
        kept = first_kept([a and b for a, b in zip(result.kept, fresh, strict=True)], want)
        timings = Counter(
            time_rollout_s=time.perf_counter() - t0,
            time_grading_s=sum(e.grading_s for g in groups for e in g),
        )
        extra = {"groups_stale": len(fresh) - sum(fresh), **staleness_stats(groups, kept, version, k)}
        rounds = max(0, -(-len(groups) // want) - 1)
        return Collected(groups, rewards, result, kept, rounds, timings, extra, version - k), self.order

    async def stop(self) -> None:
        """Cancel the outstanding episodes (a resumed run starts new ones)."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
