"""The RL stage: its task filters and the RL loop (jaxswe.rl.loop) on the stage's backend."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from jaxswe.config import RunConfig
from jaxswe.rl.inputs import RLRun
from jaxswe.rl.loop import drop_weak_tasks, filter_tasks, rl_checkpoints, rl_trainer, train_rl
from jaxswe.rl.problems import load_history
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.stages.context import StageContext
from jaxswe.train.trainer import Trainer


def history_source(cfg: RunConfig, init_from: str | None) -> str | None:
    """Where stage 2 reads the success history: rl.history_from, else the stage it starts from."""
    return cfg.rl.history_from or init_from or cfg.init_from


def check_history(cfg: RunConfig, init_from: str | None) -> None:
    """Fail before any work when rl.task_filter needs a success history that is missing."""
    source = history_source(cfg, init_from)
    if cfg.rl.task_filter == "solved_fraction" and source:
        load_history(source)


def rl_inputs(ctx: StageContext, trainer: Trainer, checkpoints: Checkpoints) -> RLRun:
    """What the RL loop needs of an opened stage whose backend is open."""
    return RLRun(
        cfg=ctx.cfg,
        stage_dir=ctx.stage_dir,
        tokenizer=ctx.tokenizer,
        task_ids=ctx.task_ids,
        make_env=ctx.make_env,
        sampling=ctx.sampling,
        backend=ctx.backend.opened,
        trainer=trainer,
        checkpoints=checkpoints,
    )


def run_rl(ctx: StageContext, *, resume: bool) -> tuple[dict[str, Any], None]:
    """Run (or resume) RL in an opened stage, its tasks narrowed by the task filters; return the
    stage summary and no params: the stage's backend already serves the trained weights."""
    checkpoints = rl_checkpoints(ctx.stage_dir, resume=resume)
    history_from = history_source(ctx.cfg, ctx.init_from)
    task_ids, counts = filter_tasks(ctx.cfg, ctx.stage_dir, ctx.task_ids, history_from)
    task_ids, strength = drop_weak_tasks(ctx.cfg, task_ids)
    ctx = replace(ctx, task_ids=task_ids)
    ctx.backend.serve()  # the starting policy, whose params the trainer then takes
    # the trainer lives only in the loop's inputs: the backend serves the trained weights and the
    # optimizer state is freed before the final eval
    summary = train_rl(rl_inputs(ctx, rl_trainer(ctx.cfg, ctx.policy), checkpoints), resume=resume)
    if counts is not None:
        summary["task_filter"] = counts
    if strength is not None:
        summary["task_strength"] = strength
    return summary, None
