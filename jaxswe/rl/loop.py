"""DAPO RL (the paper's RL stages 1 and 2): `rl_iteration` reads top to bottom.

take (the pump's judged groups: P problems x G episodes, graded in fresh sandboxes, rewards =
outcome + turn penalty, group-normalized advantages, uninformative groups and infra failures left
out) -> pack -> recompute -> check sampling (jaxswe.rl.train.prepare) -> one DAPO update per
mini-batch -> push weights (policy version `step`) -> episodes -> Orbax checkpoint (every
`rl.checkpoint_every` iterations and after the last) -> metrics row. The checkpoint is written in
the background: `save` returns once the state is in host memory, and the write goes on during the
next iteration (at k > 0 the pump's rollouts with it) until the next save or the stage end.

rl.max_staleness = 0 (the default) is the paper's synchronous loop: every episode of iteration
`step` is sampled by policy version step - 1. With k > 0 the pump keeps episodes in flight while
the trainer works (jaxswe.rl.pump). Any task ids and `Environment` factory run through the same
code, so the toy game and SWE tasks share it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from jaxswe.agent.trajectory import Trajectory, load_jsonl, save_jsonl
from jaxswe.config import OptimizerSection, RunConfig
from jaxswe.distributed import broadcast, is_main
from jaxswe.errors import UserError
from jaxswe.losses import LossSettings
from jaxswe.policy import Policy
from jaxswe.rl.groups import advantage_stats
from jaxswe.rl.inputs import RLRun
from jaxswe.rl.problems import DataOrder, History, filter_by_history, load_history, record_outcomes
from jaxswe.rl.pump import Collected, RolloutPump
from jaxswe.rl.strength import strength_pool
from jaxswe.rl.train import StepsWarning, prepare, update_metrics
from jaxswe.run import loops
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.run.files import write_json
from jaxswe.run.layout import StageDir
from jaxswe.run.loggers import stage_trackers
from jaxswe.run.metrics import MetricsLogger, read_rows
from jaxswe.run.progress import Progress
from jaxswe.train.trainer import Trainer


def rl_optimizer(cfg: RunConfig) -> OptimizerSection:
    """The optimizer settings of an RL stage: `optimizer` with `rl.warmup_steps` when set."""
    if cfg.rl.warmup_steps is None:
        return cfg.optimizer
    return cfg.optimizer.model_copy(update={"warmup_steps": cfg.rl.warmup_steps})


def rl_trainer(cfg: RunConfig, policy: Policy) -> Trainer:
    """The Trainer of an RL stage from its starting policy (whose params it takes over: one copy),
    with the config's loss settings and lr warm-up (`rl.warmup_steps`, else the optimizer's)."""
    loss = LossSettings.from_rl(cfg.rl)
    trainer = Trainer(policy.model_cfg, policy.hand_over(), rl_optimizer(cfg), loss=loss, mesh_cfg=cfg.mesh)
    rows = cfg.rl.rows_per_step
    if rows is not None and rows % trainer.rows_multiple:
        raise UserError(
            f"rl.rows_per_step ({rows}) must be a multiple of {trainer.rows_multiple}: the rows of a "
            "step are split over the mesh's data x fsdp devices and optimizer.micro_batches"
        )
    return trainer


def _episode_stats(episodes: list[Trajectory]) -> dict[str, float]:
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
    rl_run: RLRun,
    pump: RolloutPump,
    metrics: MetricsLogger,
    history: History,
    step: int,
) -> tuple[dict[str, Any], History]:
    """RL iteration `step` (1-based): returns its metrics row and the new success history."""
    t_iter = time.perf_counter()
    c, order = await pump.take(step)  # take: judged groups
    t0 = time.perf_counter()
    steps, dists, train = await asyncio.to_thread(prepare, rl_run, c, step)  # pack -> recompute -> check
    t1 = time.perf_counter()
    step_metrics = [await asyncio.to_thread(rl_run.trainer.dapo_update, batch) for batch in steps]  # update
    train.update(update_metrics(steps, dists, step_metrics, time.perf_counter() - t1))
    c.timings["time_train_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    files = StageDir(rl_run.stage_dir)
    await rl_run.backend.sync_weights(rl_run.trainer.params, files.weights, version=step)
    c.timings["time_weight_sync_s"] = time.perf_counter() - t0
    history = record_outcomes(
        history, [(g[0].task_id, [e.resolved for e in g if e.infra_error is None]) for g in c.scored.groups]
    )
    row = {**iteration_row(c, train), "time_iteration_s": time.perf_counter() - t_iter}
    save_jsonl(files.iteration_episodes(step), episode_records(c))
    meta = {"iteration": step, "seed": rl_run.cfg.seed, "data_order": order.to_json(), "history": history,
            "metrics_row": row}  # fmt: skip
    if step % rl_run.cfg.rl.checkpoint_every == 0 or step == rl_run.cfg.rl.iterations:
        # commits while the next iteration runs
        rl_run.checkpoints.save(step, rl_run.trainer.state(), meta, wait=False)
    write_json(files.history, history)
    metrics.log(step, row)
    return row, history


def iteration_row(c: Collected, train: dict[str, Any]) -> dict[str, Any]:
    """The metrics row of one iteration (but its total time)."""
    s = c.scored
    all_eps = [e for g in s.groups for e in g]
    generated = sum(e.num_generated for e in all_eps)
    flat_rewards = [r for g, rg in zip(s.groups, s.rewards, strict=True) for e, r in zip(g, rg, strict=True)
                    if e.infra_error is None]  # fmt: skip
    return {
        "reward_mean": float(np.mean(flat_rewards)) if flat_rewards else 0.0,
        **_episode_stats(all_eps),
        **advantage_stats(s.result, s.trained),
        "groups_total": len(s.groups),
        "groups_kept": sum(s.trained),
        "resample_rounds": c.rounds,
        "infra_failures": s.result.infra_failures,
        "tamper_flags": sum(e.tampered for e in all_eps),
        "tokens_generated": generated,
        "tokens_per_s": generated / max(c.timings["time_rollout_s"], 1e-9),
        **c.extra,
        **train,
        **c.timings,
    }


def episode_records(c: Collected) -> list[Trajectory]:
    """Every episode of the iteration with its shaped reward, advantage and whether its group
    trained (`Trajectory.stage`)."""
    out = []
    s = c.scored
    for g, rg, ag, keep in zip(s.groups, s.rewards, s.result.advantages, s.trained, strict=True):
        for e, r, a in zip(g, rg, ag, strict=True):
            e.stage = {"shaped_reward": r, "advantage": a, "group_kept": keep}
            out.append(e)
    return out


def filter_tasks(
    cfg: RunConfig, stage_dir: Path, task_ids: list[str], history_from: str | None
) -> tuple[list[str], dict[str, int] | None]:
    """RL stage 2's task filter (rl.task_filter solved_fraction): `task_ids` narrowed by the success
    history of `history_from` (a stage-1 RL dir), and the filter's counts (None when it is off)."""
    rl = cfg.rl
    if rl.task_filter != "solved_fraction":
        return task_ids, None
    if not history_from:
        raise UserError(
            "rl.task_filter solved_fraction needs rl.history_from (or init_from): a stage-1 RL dir"
        )
    pool, counts = filter_by_history(
        list(task_ids),
        load_history(history_from),
        drop_solved_fraction=rl.drop_solved_fraction,
        drop_never_solved=rl.drop_never_solved,
    )
    print(f"jaxswe rl: task filter from {history_from}: {counts}", file=sys.stderr)
    write_json(StageDir(stage_dir).task_filter, {**counts, "source": str(history_from), "pool": pool})
    if not pool:
        raise UserError(f"the task filter from {history_from} leaves no task to train on")
    return pool, counts


def drop_weak_tasks(cfg: RunConfig, task_ids: list[str]) -> tuple[list[str], dict[str, Any] | None]:
    """rl.min_strength: `task_ids` narrowed to the tasks whose stored test strength is at least it
    (jaxswe.rl.strength), and the counts for the summary (None when it is off)."""
    min_strength = cfg.rl.min_strength
    if min_strength is None:
        return task_ids, None
    from envs import load_tasks

    tasks = [] if cfg.env.tasks == "toy" else load_tasks(cfg.env.tasks)
    pool, counts = strength_pool(list(task_ids), {t.instance_id: t.strength for t in tasks}, min_strength)
    print(f"jaxswe rl: task strength filter: {counts}", file=sys.stderr)
    if not pool:
        raise UserError(f"rl.min_strength {min_strength} leaves no task to train on")
    return pool, counts


def iteration_line(step: int, iterations: int, row: dict[str, Any]) -> str:
    """One console line per iteration, from its metrics row."""
    stale = f", staleness max {row['staleness_max']}" if "staleness_max" in row else ""
    outages = (("infra_failures", "infra failures"), ("rollout_workers_left_out", "workers left out"),
               ("sandbox_engines_down", "engines down"))  # fmt: skip
    down = [f"{row[key]} {what}" for key, what in outages if row.get(key, 0)]
    stale += "".join(f", {d}" for d in down)
    return (
        f"jaxswe rl {step}/{iterations}: pass rate {row['pass_rate']:.2f}, "
        f"reward {row['reward_mean']:+.2f}, kept groups {row['groups_kept']}/{row['groups_total']}, "
        f"{row.get('tokens_per_s') or 0:.0f} tokens/s{stale}, {row['time_iteration_s']:.1f} s"
    )


def infra_stop_message(episodes_file: Path, iterations: int) -> str:
    """Why an RL stage stops on infrastructure failures: the last episode's cause, from the
    iteration's episodes."""
    causes = [e.infra_error for e in load_jsonl(episodes_file) if e.infra_error]
    return (
        f"in {iterations} RL iterations in a row most episodes failed on infrastructure, not by the "
        f"policy (last: {causes[-1][:400] if causes else 'unknown'}; every episode: {episodes_file}); "
        "fix it and --resume (rl.infra_stop_iterations)"
    )


def rl_checkpoints(stage_dir: Path, *, resume: bool) -> Checkpoints:
    """The RL checkpoints of a stage dir; one that holds some already needs `resume`."""
    ckpts = Checkpoints(StageDir(stage_dir).checkpoints, max_to_keep=2)
    if ckpts.steps() and not resume:
        raise UserError(f"{stage_dir}: holds RL checkpoints already; pass --resume or use a new --run-dir")
    return ckpts


def train_rl(rl_run: RLRun, *, resume: bool) -> dict[str, Any]:
    """Run (or resume) the configured number of iterations; return the stage summary so far (the
    RL stage adds its task filters' counts, evaluates and writes it).

    Resume at k = 0 is exact: a run killed anywhere and resumed writes the same rows (timings
    aside) and episodes as one never stopped, since every draw follows (run seed, data order,
    sample, turn) and the checkpoint holds the weights, optimizer state, data order and history.
    At k > 0 the episodes in flight when the checkpoint was written are lost: the resumed run
    starts new ones under the restored weights (the next iteration's groups are all sampled by
    that version, where the uninterrupted run's were partly older), and the problems drawn for
    the lost ones are not drawn again before the epoch ends. A row may be written before its
    checkpoint commits: resume drops the rows past the newest committed checkpoint and redoes them."""
    cfg, stage_dir, trainer, ckpts = rl_run.cfg, rl_run.stage_dir, rl_run.trainer, rl_run.checkpoints
    history: History = {}
    order = DataOrder()
    start = 0
    last_row = None
    restored = ckpts.restore_latest(trainer.state()) if resume else None
    if restored is not None:
        start, items, meta = restored
        trainer.load_state(items)
        history = {k: list(v) for k, v in meta["history"].items()}
        order = DataOrder.from_json(meta["data_order"])
        last_row = meta.get("metrics_row")
        print(f"jaxswe: resuming RL from iteration {start} ({ckpts.directory / str(start)})", file=sys.stderr)
    metrics = MetricsLogger(stage_dir, start_step=start + 1, trackers=stage_trackers(cfg, stage_dir, "rl"))
    if last_row is not None and not any(r["step"] == start for r in read_rows(metrics.path)):
        metrics.log(start, last_row)  # killed after the checkpoint committed, before the row

    # one event loop for the whole stage: at k > 0 episodes stay in flight across iterations
    with asyncio.Runner() as runner:
        pump, drawn = None, {}
        try:
            if start > 0:
                loops.run_in(
                    runner,
                    rl_run.backend.sync_weights(trainer.params, StageDir(stage_dir).weights, version=start),
                )
            pump = RolloutPump(rl_run, order)
            # one bar per run, not per process; no periodic lines: the per-iteration lines say it all
            with Progress(
                "rl", cfg.rl.iterations, unit="iteration", initial=start, enabled=is_main(), lines=False
            ) as progress:
                too_many_steps = StepsWarning(cfg.rl)
                infra_run = 0  # iterations in a row in which most episodes failed on infrastructure
                for step in range(start + 1, cfg.rl.iterations + 1):
                    row, history = loops.run_in(runner, rl_iteration(rl_run, pump, metrics, history, step))
                    progress.write(iteration_line(step, cfg.rl.iterations, row))
                    if warning := too_many_steps(row["optimizer_steps"]):
                        progress.write(warning)
                    progress.update()
                    infra_run = infra_run + 1 if 2 * row["infra_failures"] > row["episodes"] else 0
                    if infra_run == cfg.rl.infra_stop_iterations:
                        raise UserError(
                            infra_stop_message(StageDir(stage_dir).iteration_episodes(step), infra_run)
                        )
        finally:
            if pump is not None:
                drawn = runner.run(pump.stop())
            runner.run(rl_run.backend.release())
    metrics.close()
    ckpts.close()
    rows = read_rows(metrics.path)
    return {
        "name": "rl",
        "iterations": len(rows),
        "optimizer_steps": sum(r.get("optimizer_steps", 0) for r in rows),
        "final_pass_rate": rows[-1]["pass_rate"] if rows else None,
        "checkpoint": str(ckpts.directory),
        **broadcast(drawn),  # this run's: a resumed run counts from its resume
    }
