"""Collection: the groups one RL iteration trains on, from a `RolloutPump` at any staleness k.

A group is G episodes of one problem, scored (jaxswe.rl.groups: rewards, advantages, whether it
trains) only when all its episodes are done; the pump only schedules. `draw` picks the next
problems from the seeded data order and gives every episode its seed from (run seed, the order
before the draw, the problem's place in it, the sample); the order is in every checkpoint, so a
resumed run replays the same episodes.

k = 0 (rl.max_staleness 0, the paper's synchronous loop; `_rounds`): nothing is sampled ahead.
`take` draws P problems under policy version step - 1, waits for every group, and with
rl.resample_to_fill draws the missing count again, up to rl.max_resample_rounds more rounds
(DAPO's dynamic sampling).

k > 0 (asynchronous, partial rollouts; `_stream`): the pump keeps k x P groups outstanding
(running, or done and not yet taken) and starts a new group as soon as one is taken, so the engine
never waits for the trainer and the trainer never waits for the slowest episode. Weight updates do
not stop episodes: a running episode continues under the new weights from its next turn, and every
sampled token keeps the version that sampled it (`Trajectory.policy_versions`). `take` hands
policy version step - 1 finished groups until P of them may train, within P x (1 + rounds) groups:
of the groups done, the first drawn; else the next to finish; then in draw order, so the batches
depend on timing only through which groups are done when it looks. A token more than k versions
behind the trainer is stale; how stale tokens train is rl.stale_tokens (jaxswe.rl.groups).

With several JAX processes and k = 0 over HTTP servers (`Backend.spread`), every process runs the
pump: each round's episodes are spread over the processes (process p drives episodes p, p + n, ...
with its own client and sandboxes) and all-gathered, so every process judges the same groups and
trains on the same batches, and no one process drives them all. Otherwise (k > 0, or the embedded
sampler on process 0) the pump runs on process 0, like every other rollout (jaxswe.distributed),
and `take` broadcasts the scored groups.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import jax

from jaxswe.agent.episodes import collect_episodes
from jaxswe.agent.trajectory import Trajectory
from jaxswe.config import RunConfig
from jaxswe.distributed import on_main_async
from jaxswe.rl.groups import Scored, Scorer
from jaxswe.rl.inputs import RLRun
from jaxswe.rl.problems import DataOrder, next_problems
from jaxswe.rollout.types import derive_seed


@dataclass
class Collected:
    """The scored groups one iteration trains from, with how they were collected."""

    scored: Scored
    rounds: int = 0  # resample rounds beyond the first
    timings: Counter = field(default_factory=Counter)
    extra: dict[str, float] = field(default_factory=dict)  # staleness (k > 0) and infra health


def infra_health(rl_run: RLRun) -> dict[str, int]:
    """What is down now: rollout workers left out of weight updates (they do not answer) and
    sandbox engines of the pool that do not answer (0 when there is no pool or no worker list)."""
    stale = getattr(rl_run.backend.engine, "stale", ())
    from envs.provision.engines import default_pool

    pool = default_pool() if rl_run.cfg.env.backend == "docker" else None
    down = sum(not healthy for _, _, healthy in pool.load().values()) if pool is not None else 0
    return {"rollout_workers_left_out": len(stale), "sandbox_engines_down": down}


def draw(cfg: RunConfig, task_ids: list[str], count: int, order: DataOrder):
    """(the next `count` problems, each one's G episode seeds, the advanced order)."""
    problems, after = next_problems(task_ids, count, order, cfg.seed)
    at = (order.epoch, order.cursor)
    group = range(cfg.rl.group_size)
    seeds = [[derive_seed(cfg.seed, "rl", at, j, s) for s in group] for j in range(len(problems))]
    return problems, seeds, after


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
        scorer, version = Scorer.from_config(self.rl_run.cfg), step - 1
        t0 = time.perf_counter()
        collect = self._stream if scorer.k else self._rounds
        taken, resampled = await collect(scorer, version)
        scored = scorer.score([group for _, group in sorted(taken, key=lambda t: t[0])], version)
        timings = Counter(
            time_rollout_s=time.perf_counter() - t0,
            # summed over parallel episodes
            time_grading_s=sum(e.grading_s for g in scored.groups for e in g),
        )
        extra = {**scored.staleness, **infra_health(self.rl_run)}
        return Collected(scored, resampled, timings, extra), self.order

    def _limits(self) -> tuple[int, int]:
        """(the groups an iteration trains on, P; the resample rounds beyond the first)."""
        rl = self.rl_run.cfg.rl
        return rl.problems_per_iteration, rl.max_resample_rounds if rl.resample_to_fill else 0

    async def _rounds(self, scorer: Scorer, version: int) -> tuple[list[tuple[int, list[Trajectory]]], int]:
        """k = 0: rounds of groups all sampled by `version`: P groups, then the missing count
        again while some are missing, up to the resample rounds; returns the (draw index, group)
        pairs and the rounds beyond the first."""
        want, extra_rounds = self._limits()
        taken, candidates, rounds = [], 0, 0
        while candidates < want and rounds <= extra_rounds:
            self._start(want - candidates)
            rounds += 1
            while self.outstanding:
                index, group = await self._next_group()
                taken.append((index, group))
                candidates += scorer.candidate(group, version)
        return taken, rounds - 1

    async def _stream(self, scorer: Scorer, version: int) -> tuple[list[tuple[int, list[Trajectory]]], int]:
        """k > 0: the finished groups one at a time (`_next_group`) until P of them may train or
        P x (1 + resample rounds) are taken; returns the (draw index, group) pairs and the rounds
        beyond the first they amount to."""
        want, extra_rounds = self._limits()
        taken, candidates = [], 0
        while candidates < want and len(taken) < want * (1 + extra_rounds):
            index, group = await self._next_group()
            taken.append((index, group))
            candidates += scorer.candidate(group, version)
        return taken, max(0, -(-len(taken) // want) - 1)

    async def stop(self) -> dict[str, int]:
        """Cancel the outstanding episodes (a resumed run starts new ones); returns the episode
        count of this pump: drawn, and drawn but never handed to the trainer (cancelled running,
        or finished after the last take), so every episode drawn is accounted for."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        g = self.rl_run.cfg.rl.group_size
        return {"episodes_drawn": self.drawn * g, "episodes_not_taken": (self.drawn - self.taken) * g}
