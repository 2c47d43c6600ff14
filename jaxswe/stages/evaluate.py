"""Evaluation of a policy: k samples per task -> Pass@1 (95% interval), Pass@k, how episodes
ended, mean turns, a per-task table; written to the stage dir."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from jaxswe.agent.episodes import collect_episodes
from jaxswe.agent.trajectory import Trajectory, save_jsonl
from jaxswe.config import RunConfig
from jaxswe.distributed import is_main
from jaxswe.errors import UserError
from jaxswe.rl.strength import strength_summary
from jaxswe.rollout.backends import run_phase
from jaxswe.rollout.types import derive_seed
from jaxswe.run.files import write_json
from jaxswe.run.layout import StageDir
from jaxswe.run.loggers import stage_trackers
from jaxswe.run.metrics import MetricsLogger
from jaxswe.run.plots import plot_eval
from jaxswe.run.progress import Progress
from jaxswe.stages.context import StageContext
from jaxswe.stages.eval_stats import format_table, summarize
from jaxswe.stages.toy import is_toy


def report_from_episodes(episodes: list[Trajectory], ks: list[int]) -> dict[str, Any]:
    """The eval report; infra failures are left out of every rate (and counted). `episodes` in
    sample order within each task (as `evaluate` draws them), so that each task's `outcomes` pair
    by sampling seed with another stage's."""
    per_task: dict[str, list[bool]] = {}
    outcomes: dict[str, list[int | None]] = {}
    scored = [e for e in episodes if e.infra_error is None]
    for e in episodes:
        outcomes.setdefault(e.task_id, []).append(None if e.infra_error is not None else int(e.resolved))
    for e in scored:
        per_task.setdefault(e.task_id, []).append(e.resolved)
    ends, turns = [e.ended_by for e in scored], [e.num_turns for e in scored]
    report = summarize(per_task, ends, turns, ks, outcomes)
    report["infra_failures"] = len(episodes) - len(scored)
    return report


async def evaluate(
    ctx: StageContext, samples: int, name: str = "eval", task_ids: list[str] | None = None
) -> tuple[dict[str, Any], list[Trajectory]]:
    """`samples` episodes per eval task (`task_ids`, default `ctx.eval_ids`) on the stage's
    backend, seeded by (run seed, `name`): every stage's `final_eval` (and `heldout_eval`) uses
    the same seeds, so stage-vs-stage comparisons share their random numbers; the eval stage
    draws its own."""
    cfg = ctx.cfg
    ids = [t for t in (ctx.eval_ids if task_ids is None else task_ids) for _ in range(samples)]
    progress = Progress(name, len(ids), unit="episode", enabled=is_main())
    resolved = 0

    def count(_: int, episode: Trajectory) -> None:  # process 0 only (it runs the episodes)
        nonlocal resolved
        resolved += episode.resolved
        progress.update(resolved=resolved)

    with progress:
        episodes, secs = await collect_episodes(
            ids,
            ctx.make_env,
            ctx.backend.opened.engine,
            ctx.tokenizer,
            replace(
                ctx.sampling,
                temperature=cfg.eval.temperature,
                sampling_seed=derive_seed(cfg.seed, "eval", name),
            ),
            cfg.agent,
            concurrency=cfg.env.max_parallel,
            on_done=count,
        )
    report = report_from_episodes(episodes, cfg.eval.pass_at_k)
    report["time_s"] = secs
    return report, episodes


def task_strength(cfg: RunConfig, task_ids: list[str]) -> dict[str, Any] | None:
    """The stored test strength of the evaluated tasks (jaxswe.rl.strength); None for the toy game."""
    if is_toy(cfg):
        return None
    from envs import load_tasks

    tasks = load_tasks(cfg.env.eval_tasks or cfg.env.tasks)  # eval and held-out tasks come from it
    return strength_summary(task_ids, {t.instance_id: t.strength for t in tasks})


def run_eval_stage(
    ctx: StageContext, *, samples: int | None = None, name: str = "eval", ids: list[str] | None = None
) -> dict[str, Any]:
    """Evaluate the policy `ctx.backend` serves on `ids` (default `ctx.eval_ids`); write
    <name>.json, trajectories, a metrics row and a plot; return the report (with the tasks'
    `task_strength`)."""
    cfg, stage_dir = ctx.cfg, ctx.stage_dir
    samples = samples or cfg.eval.samples_per_task
    report, episodes = run_phase(ctx.backend.opened, evaluate(ctx, samples, name, ids))
    strength = task_strength(cfg, ctx.eval_ids if ids is None else ids)
    if strength is not None:
        report["task_strength"] = strength
    files = StageDir(stage_dir)
    save_jsonl(files.episodes(name), episodes)
    write_json(files.eval_report(name), report)
    where = files.eval_dir(name)
    metrics = MetricsLogger(where, trackers=stage_trackers(cfg, where, name))
    row = {k: v for k, v in report.items() if isinstance(v, int | float)}
    metrics.log(0, {**row, "pass_rate": report["pass_at_1"]})
    metrics.close()
    if is_main():
        files.eval_table(name).write_text(format_table(report) + "\n")
        plot_eval(report, files.eval_plot(name), title=f"{cfg.name}: {name}")
    return report


def eval_weights(cfg: RunConfig, init_from: str | None) -> str:
    """What an eval stage evaluates, in words; a random init only with eval.allow_random_init."""
    init_from = init_from or cfg.init_from
    if init_from:
        return str(init_from)
    if cfg.model.path:
        return f"model.path {cfg.model.path}"
    if not cfg.eval.allow_random_init:
        raise UserError(
            "eval has no trained weights to evaluate: pass --init-from (a stage or run dir), "
            "a --run-dir holding a trained stage, or model.path; "
            "--set eval.allow_random_init=true evaluates a random init"
        )
    model = "the toy model" if is_toy(cfg) else f"model.preset {cfg.model.preset}"
    return f"random init of {model} (model.seed {cfg.model.seed})"


def run_eval(ctx: StageContext, *, resume: bool) -> tuple[dict[str, Any], None]:
    """The eval stage: the report of the policy it starts from, as its summary (no params: it
    trains nothing; a --resume of an unfinished eval evaluates again)."""
    ctx.backend.serve()
    report = run_eval_stage(ctx)
    keys = ("pass_at_1", "pass_at_1_ci95", "num_tasks", "num_episodes", "ended_by", "mean_turns")
    summary = {
        "name": "eval",
        "weights": eval_weights(ctx.cfg, ctx.init_from),
        **{k: report[k] for k in keys},
    }
    summary.update({k: v for k, v in report.items() if k.startswith("pass_at_") or k == "task_strength"})
    return summary, None
