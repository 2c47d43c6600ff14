"""The RL stage: its task filters, the RL loop (jaxswe.rl.loop) on the stage's backend, its end."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from jaxswe.rl.inputs import RLRun
from jaxswe.rl.loop import drop_weak_tasks, filter_tasks, rl_checkpoints, rl_trainer, train_rl
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.stages.context import StageContext, ensure_backend
from jaxswe.stages.finish import finish_stage
from jaxswe.train.trainer import Trainer


def rl_inputs(ctx: StageContext, trainer: Trainer, checkpoints: Checkpoints) -> RLRun:
    """What the RL loop needs of an opened stage whose backend is open."""
    return RLRun(
        cfg=ctx.cfg,
        stage_dir=ctx.stage_dir,
        tokenizer=ctx.tokenizer,
        task_ids=ctx.task_ids,
        make_env=ctx.make_env,
        sampling=ctx.sampling,
        backend=ctx.backend,
        trainer=trainer,
        checkpoints=checkpoints,
    )


def run_rl(ctx: StageContext, *, resume: bool, history_from: str | None = None) -> dict[str, Any]:
    """Run (or resume) RL in an opened stage, its tasks narrowed by the task filters; return the
    stage summary (written by `finish_stage`)."""
    checkpoints = rl_checkpoints(ctx.stage_dir, resume=resume)
    task_ids, counts = filter_tasks(ctx.cfg, ctx.stage_dir, ctx.task_ids, history_from)
    task_ids, strength = drop_weak_tasks(ctx.cfg, task_ids)
    ctx = replace(ctx, task_ids=task_ids)  # the caller's context keeps the stage's inputs
    ensure_backend(ctx)  # serves the starting policy, whose params the trainer then takes
    # the trainer lives only in the loop's inputs: the backend serves the trained weights and the
    # optimizer state is freed before the final eval
    summary = train_rl(rl_inputs(ctx, rl_trainer(ctx.cfg, ctx.policy), checkpoints), resume=resume)
    if counts is not None:
        summary["task_filter"] = counts
    if strength is not None:
        summary["task_strength"] = strength
    return finish_stage(ctx, summary)
