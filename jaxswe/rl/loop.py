"""DAPO RL (the paper's RL stages 1 and 2): `rl_iteration` reads top to bottom.

take (the pump's judged groups: P problems x G episodes, graded in fresh sandboxes, rewards =
outcome + turn penalty, group-normalized advantages, uninformative groups and infra failures left
out) -> pack -> recompute -> check sampling -> update (jaxswe.rl.train) -> push weights (policy
version `step`) -> Orbax checkpoint -> episodes and the metrics row.

rl.max_staleness = 0 (the default) is the paper's synchronous loop: every episode of iteration
`step` is sampled by policy version step - 1. With k > 0 the pump keeps episodes in flight while
the trainer works (jaxswe.rl.pump). Any task ids and `Environment` factory run through the same
code, so the toy game and SWE tasks share it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import numpy as np
from tqdm import tqdm

from jaxswe.config import RunConfig
from jaxswe.distributed import is_main
from jaxswe.errors import UserError
from jaxswe.losses import LossSettings
from jaxswe.policy import Policy
from jaxswe.rl.problems import DataOrder, History, record_outcomes
from jaxswe.rl.pump import Collected, RolloutPump
from jaxswe.rl.rewards import advantage_stats
from jaxswe.rl.train import train_on
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.run.metrics import MetricsLogger, read_rows
from jaxswe.run.plots import plot_metrics
from jaxswe.stages.context import StageContext
from jaxswe.stages.episodes import Episode, save_episodes
from jaxswe.stages.rollouts import run_phase
from jaxswe.stages.stage_io import write_json
from jaxswe.train.trainer import Trainer


def rl_trainer(cfg: RunConfig, policy: Policy) -> Trainer:
    """The Trainer of an RL stage from its starting policy, with the config's loss settings."""
    loss = LossSettings.from_rl(cfg.rl)
    return Trainer(policy.model_cfg, policy.params, cfg.optimizer, loss=loss, mesh_cfg=cfg.mesh)


def _episode_stats(episodes: list[Episode]) -> dict[str, float]:
    scored = [e for e in episodes if e.infra_error is None]
    n = max(len(scored), 1)
    ends = Counter(e.ended_by for e in scored)
    return {
        "pass_rate": sum(e.resolved for e in scored) / n,
        "mean_turns": float(np.mean([e.num_turns for e in scored])) if scored else 0.0,
        "submit_ratio": ends.get("submitted", 0) / n,
        "ended_by_limit_ratio": (ends.get("max_turns", 0) + ends.get("context", 0)) / n,
        "episodes": len(episodes),
    }


async def rl_iteration(
    ctx: StageContext,
    pump: RolloutPump,
    ckpts: Checkpoints,
    metrics: MetricsLogger,
    history: History,
    step: int,
) -> tuple[dict[str, Any], History]:
    """RL iteration `step` (1-based): returns its metrics row and the new success history."""
    t_iter = time.perf_counter()
    c, order = await pump.take(step)  # take: judged groups
    t0 = time.perf_counter()
    train = await asyncio.to_thread(train_on, ctx, c, step)  # pack -> recompute -> check -> update
    c.timings["time_train_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    await ctx.backend.sync_weights(ctx.trainer.params, ctx.stage_dir / "weights", version=step)
    c.timings["time_weight_sync_s"] = time.perf_counter() - t0
    history = record_outcomes(
        history, [(g[0].task_id, [e.resolved for e in g if e.infra_error is None]) for g in c.groups]
    )
    row = {**iteration_row(c, train), "time_iteration_s": time.perf_counter() - t_iter}
    save_episodes(ctx.stage_dir / "trajectories" / f"iter_{step:04d}.jsonl", *episode_records(c))
    meta = {"iteration": step, "seed": ctx.cfg.seed, "data_order": order.to_json(), "history": history,
            "metrics_row": row}  # fmt: skip
    ckpts.save(step, ctx.trainer.state(), meta)
    write_json(ctx.stage_dir / "history.json", history)
    metrics.log(step, row)
    return row, history


def iteration_row(c: Collected, train: dict[str, Any]) -> dict[str, Any]:
    """The metrics row of one iteration (but its total time)."""
    all_eps = [e for g in c.groups for e in g]
    generated = sum(e.num_generated for e in all_eps)
    flat_rewards = [r for g, rg in zip(c.groups, c.rewards, strict=True) for e, r in zip(g, rg, strict=True)
                    if e.infra_error is None]  # fmt: skip
    return {
        "reward_mean": float(np.mean(flat_rewards)) if flat_rewards else 0.0,
        **_episode_stats(all_eps),
        **advantage_stats(c.result, c.kept),
        "groups_total": len(c.groups),
        "groups_kept": sum(c.kept),
        "resample_rounds": c.rounds,
        "infra_failures": c.result.infra_failures,
        "tamper_flags": sum(e.tampered for e in all_eps),
        "tokens_generated": generated,
        "tokens_per_s": generated / max(c.timings["time_rollout_s"], 1e-9),
        **c.extra,
        **train,
        **c.timings,
    }


def episode_records(c: Collected) -> tuple[list[Episode], list[dict[str, Any]]]:
    """Every episode of the iteration and its reward, advantage and whether its group trained."""
    extras = []
    for rg, ag, keep in zip(c.rewards, c.result.advantages, c.kept, strict=True):
        extras += [{"reward": r, "advantage": a, "group_kept": keep} for r, a in zip(rg, ag, strict=True)]
    return [e for g in c.groups for e in g], extras


def run_rl(ctx: StageContext, *, resume: bool, history: History | None = None) -> dict[str, Any]:
    """Run (or resume) the configured number of iterations; return the stage summary.

    Resume at k = 0 is exact: a run killed anywhere and resumed writes the same rows (timings
    aside) and episodes as one never stopped, since every draw follows (run seed, data order,
    sample, turn) and the checkpoint holds the weights, optimizer state, data order and history.
    At k > 0 the episodes in flight when the checkpoint was written are lost: the resumed run
    starts new ones under the restored weights (the next iteration's groups are all sampled by
    that version, where the uninterrupted run's were partly older), and the problems drawn for
    the lost ones are not drawn again before the epoch ends."""
    cfg, stage_dir = ctx.cfg, ctx.stage_dir
    ckpts = Checkpoints(stage_dir / "checkpoints", max_to_keep=2)
    history = dict(history or {})
    order = DataOrder()
    start = 0
    last_row = None
    if ckpts.steps() and not resume:
        raise UserError(f"{stage_dir}: holds RL checkpoints already; pass --resume or use a new --run-dir")
    if resume:
        restored = ckpts.restore_latest(ctx.trainer.state())
        if restored is not None:
            start, items, meta = restored
            ctx.trainer.load_state(items)
            history = {k: list(v) for k, v in meta["history"].items()}
            order = DataOrder.from_json(meta["data_order"])
            last_row = meta.get("metrics_row")
            print(f"jaxswe: resuming RL from iteration {start} ({ckpts.directory / str(start)})")
    metrics = MetricsLogger(stage_dir, start_step=start + 1)
    if last_row is not None and not any(r["step"] == start for r in read_rows(metrics.path)):
        metrics.log(start, last_row)  # killed after the checkpoint committed, before the row

    async def loop() -> None:
        nonlocal history
        if start > 0:
            await ctx.backend.sync_weights(ctx.trainer.params, stage_dir / "weights", version=start)
        pump = RolloutPump(ctx, order)
        bar = tqdm(
            range(start + 1, cfg.rl.iterations + 1),
            desc="rl",
            initial=start,
            total=cfg.rl.iterations,
            disable=not is_main(),  # one progress bar per run, not per process
        )
        try:
            for step in bar:
                row, history = await rl_iteration(ctx, pump, ckpts, metrics, history, step)
                bar.set_postfix(reward=f"{row['reward_mean']:.2f}", passed=f"{row['pass_rate']:.2f}")
        finally:
            await pump.stop()

    run_phase(ctx.backend, loop())
    metrics.close()
    ckpts.close()
    if is_main():
        plot_metrics(metrics.path, stage_dir / "plots" / "rl_curves.png", title=f"{cfg.name}: RL")
    rows = read_rows(metrics.path)
    return {
        "name": "rl",
        "iterations": len(rows),
        "final_pass_rate": rows[-1]["pass_rate"] if rows else None,
        "checkpoint": str(ckpts.directory),
    }
