"""One entry point per stage (warmstart, rft, rl, eval) and the pipeline that chains them,
handing each stage's Orbax checkpoint to the next."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from jaxswe.config import RunConfig
from jaxswe.distributed import barrier, is_main
from jaxswe.errors import UserError
from jaxswe.rl.strength import strength_line
from jaxswe.run.files import read_json, write_json
from jaxswe.run.layout import StageDir
from jaxswe.run.plots import plot_metrics
from jaxswe.stages.context import check_inputs, open_stage
from jaxswe.stages.eval_stats import fixed_task_difference, paired_difference, paired_outcome_difference
from jaxswe.stages.evaluate import eval_weights, run_eval
from jaxswe.stages.finish import finish_stage
from jaxswe.stages.rft import run_rft
from jaxswe.stages.rl import check_history, run_rl
from jaxswe.stages.runtime import env_factory
from jaxswe.stages.stage_io import (
    check_run_dir,
    config_changes,
    record_config,
    write_partial_summary,
)
from jaxswe.stages.warmstart import build_policy, run_warmstart

# every stage: run(ctx, *, resume) -> (summary, trained params or None)
RUNS = {"warmstart": run_warmstart, "rft": run_rft, "rl": run_rl, "eval": run_eval}
STAGES = tuple(RUNS)


def result_line(summary: dict[str, Any]) -> str:
    """A finished stage's headline: pass@1 with its 95% interval when the stage was evaluated."""
    if summary.get("pass_at_1") is None:
        rate = summary.get("final_pass_rate", summary.get("sample_pass_rate"))
        seen = f"training-sample pass rate {rate:.3f}; " if rate is not None else ""
        return f"{seen}not evaluated (eval.after_stage: false)"
    lo, hi = summary.get("pass_at_1_ci95") or (float("nan"), float("nan"))
    episodes = f", {summary['num_episodes']} episodes" if "num_episodes" in summary else ""
    strength = strength_line(summary.get("task_strength"))
    return f"pass@1 {summary['pass_at_1']:.3f} (95% interval {lo:.3f}-{hi:.3f}{episodes}){strength}"


def run_stage(
    name: str, cfg: RunConfig, stage_dir: Path, *, init_from: str | None, resume: bool
) -> dict[str, Any]:
    """Run one stage into `stage_dir`: check its inputs, open it (starting policy, banner), run it,
    finish it (eval, checkpoint, summary.json) and print its result line (stderr); return its
    summary. Ctrl-C leaves the curves and a partial summary."""
    start = time.monotonic()
    if name not in RUNS:
        raise UserError(f"unknown stage {name!r}; choose one of {STAGES}")
    stage_dir = Path(stage_dir)
    check_run_dir(stage_dir, resume=resume)  # before anything is written into it
    changes = config_changes(stage_dir, cfg)
    if resume and StageDir(stage_dir).summary.is_file():  # finished: its summary stands
        return finished_stage(name, stage_dir, cfg, changes)
    try:
        inputs = check_inputs(cfg)
        policy = None
        if name == "warmstart":  # builds its tokenizer and model: it starts from nothing
            init_from = None
            stage_dir.mkdir(parents=True, exist_ok=True)
            policy = build_policy(cfg, stage_dir, inputs.tasks, env_factory(cfg, inputs.tasks))
        elif name == "rl":
            check_history(cfg, init_from)
        if name == "eval":  # refuses a random init before anything is written
            banner = f"eval of {eval_weights(cfg, init_from)}"
        else:
            banner = name + (f" from {init_from}" if init_from else "")
        ctx = open_stage(cfg, stage_dir, init_from=init_from, policy=policy, inputs=inputs)
        print(f"jaxswe: == {banner} -> {stage_dir}", file=sys.stderr, flush=True)
        summary = finish_stage(ctx, *RUNS[name](ctx, resume=resume))
    except KeyboardInterrupt:  # Ctrl-C: the curves and summary so far (not summary.json: not done)
        files = StageDir(stage_dir)
        if is_main() and files.metrics.is_file() and name != "eval":
            plot_metrics(files.metrics, files.curves(name), title=f"{name} (interrupted)")
        if stage_dir.is_dir():
            write_partial_summary(name, stage_dir)
        raise
    minutes, seconds = divmod(int(time.monotonic() - start), 60)
    print(
        f"jaxswe: == {name} done in {minutes}m{seconds:02d}s: {result_line(summary)}",
        file=sys.stderr,
        flush=True,
    )
    return check_trained(summary, cfg)


def finished_stage(name: str, stage_dir: Path, cfg: RunConfig, changes: dict[str, Any]) -> dict[str, Any]:
    """A --resume of a stage that finished: its summary.json as it is (nothing runs again)."""
    changed = [k for k in changes if k != "allow_untrained_stage"]  # that one is read here
    ignored = f"; the changed settings ({', '.join(changed)}) do not apply to it" if changed else ""
    summary = StageDir(stage_dir).summary
    print(f"jaxswe: == {name} finished before ({summary}){ignored}", file=sys.stderr)
    return check_trained(read_json(summary), cfg)


def check_trained(summary: dict[str, Any], cfg: RunConfig) -> dict[str, Any]:
    """`summary` back; an RL stage with no optimizer step or an RFT stage with no kept trajectory
    is an error unless `allow_untrained_stage` (its summary.json stays, with the counts)."""
    name = summary.get("name")
    if name == "rl" and summary.get("optimizer_steps") == 0:
        why = f"0 optimizer steps in {summary['iterations']} iterations (every group's rewards were equal)"
    elif name == "rft" and summary.get("sft_steps") == 0:
        why = f"no resolved trajectory among {summary['samples']} samples, 0 SFT steps"
    else:
        return summary
    if cfg.allow_untrained_stage:
        print(f"jaxswe: WARNING: the {name} stage trained nothing: {why}", file=sys.stderr)
        return summary
    raise UserError(
        f"the {name} stage trained nothing: {why}; its weights are the ones it started from "
        "(--set allow_untrained_stage=true accepts such a stage)"
    )


def run_pipeline(cfg: RunConfig, run_dir: Path, *, resume: bool) -> dict[str, Any]:
    """Run cfg.stages in order, each in run_dir/<stage>, each starting from the previous one's
    checkpoint; run_dir/summary.json lists {"name", "pass_at_1", ...} per stage in run order."""
    run_dir = Path(run_dir)
    if not cfg.stages:
        raise UserError("config lists no stages")
    if "warmstart" in cfg.stages[1:]:
        raise UserError("warmstart can only be the first stage")
    if cfg.stages[0] != "warmstart" and not (cfg.init_from or cfg.model.path or cfg.model.preset):
        raise UserError("the first stage needs a model: init_from, model.path or model.preset")
    if cfg.stages[0] == "eval":
        eval_weights(cfg, cfg.init_from)  # refused now, not after the run dir is written
    check_run_dir(run_dir, resume=resume)
    config_changes(run_dir, cfg)
    check_inputs(cfg)
    barrier("pipeline checked")  # every process saw run_dir before process 0 writes into it
    record_config(run_dir, cfg)
    summaries: list[dict[str, Any]] = []
    previous = cfg.init_from
    for name in cfg.stages:
        stage_dir = run_dir / name
        done = StageDir(stage_dir).summary
        if resume and done.is_file():
            summary = check_trained(read_json(done), cfg)
        else:
            summary = run_stage(name, cfg, stage_dir, init_from=previous, resume=resume)
        summaries.append(summary)
        write_json(StageDir(run_dir).summary, {"stages": summaries})
        if name != "eval":
            previous = str(stage_dir)
    out = {"stages": summaries, "paired": paired_comparisons(run_dir, cfg.stages)}
    if cfg.eval.heldout:
        out["paired_heldout"] = paired_comparisons(run_dir, cfg.stages, report="heldout_eval")
    for held, p in [("", p) for p in out["paired"]] + [
        (" held-out", p) for p in out.get("paired_heldout", [])
    ]:
        lo, hi = p["ci95"]
        these = p["these_tasks"]
        flo, fhi = these["ci95"]
        unit = (f"{these['num_episodes'] // 2} episode pairs (same seeds)" if these["method"] == "paired"
                else f"{these['num_episodes']} episodes")  # fmt: skip
        print(
            f"jaxswe: {p['after']} - {p['before']}{held} pass@1: {p['diff']:+.3f} (95% interval {lo:+.3f} to "
            f"{hi:+.3f} paired over {p['num_tasks']} tasks; {flo:+.3f} to {fhi:+.3f} on these tasks "
            f"over {unit})",
            file=sys.stderr,
        )
    write_json(StageDir(run_dir).summary, out)
    return out


def paired_comparisons(run_dir: Path, stages: list[str], report: str = "final_eval") -> list[dict[str, Any]]:
    """Each evaluated training stage against the previous one (the eval.after_stage evaluations,
    `report`: final_eval, or heldout_eval for the eval.heldout tasks): paired over the
    tasks (tasks as the unit: would it hold on other tasks like these?) and, under `these_tasks`,
    on exactly these tasks (episodes as the unit): pair by pair where both reports hold each
    sample's outcome (the after-stage evals share their sampling seeds), else as independent
    samples (`method` says which)."""
    per_task = {}
    for name in stages:
        path = StageDir(run_dir / name).eval_report(report)
        if name != "eval" and path.is_file():
            per_task[name] = read_json(path)["per_task"]
    rates = {n: {t: r["rate"] for t, r in v.items()} for n, v in per_task.items()}
    counts = {n: {t: (r["successes"], r["samples"]) for t, r in v.items()} for n, v in per_task.items()}
    outcomes = {n: {t: r["outcomes"] for t, r in v.items() if "outcomes" in r} for n, v in per_task.items()}

    def these_tasks(a: str, b: str) -> dict[str, Any]:  # paired by seed where both kept outcomes
        return paired_outcome_difference(outcomes[a], outcomes[b]) or fixed_task_difference(
            counts[a], counts[b]
        )

    names = list(per_task)
    return [
        {"before": a, "after": b, **paired_difference(rates[a], rates[b]), "these_tasks": these_tasks(a, b)}
        for a, b in zip(names, names[1:], strict=False)
    ]
