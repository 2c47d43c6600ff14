"""Rejection fine-tuning: sample N trajectories per task with the current model, keep the resolved
ones, SFT on them (format-error turns stay in context, out of the loss), save a checkpoint."""

from __future__ import annotations

from typing import Any

from jaxswe.config import RunConfig
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.run.metrics import MetricsLogger
from jaxswe.stages.context import StageContext, ensure_backend
from jaxswe.stages.episodes import load_episodes, save_episodes
from jaxswe.stages.rl import rl_sampling
from jaxswe.stages.rollouts import collect_episodes, run_phase
from jaxswe.stages.runtime import Policy
from jaxswe.stages.sft import run_sft
from jaxswe.stages.trainer import Trainer


def rft_trainer(cfg: RunConfig, policy: Policy) -> Trainer:
    """The RFT trainer: fp32 masters and AdamW moments (model.param_dtype) at rft.lr."""
    opt = cfg.optimizer.model_copy(update={"lr": cfg.rft.lr}) if cfg.rft.lr else cfg.optimizer
    return Trainer(policy.model_cfg, policy.params, opt, mesh_cfg=cfg.mesh)


def run_rft(ctx: StageContext, *, resume: bool) -> tuple[dict[str, Any], Any]:
    """Returns the stage summary and the trained params."""
    cfg, stage_dir = ctx.cfg, ctx.stage_dir
    trainer = rft_trainer(cfg, ctx.policy)
    ckpts = Checkpoints(stage_dir / "checkpoints", max_to_keep=1)
    samples_path = stage_dir / "trajectories" / "samples.jsonl"
    if resume:
        restored = ckpts.restore_latest(trainer.state())
        if restored is not None:  # the stage finished before
            _, items, meta = restored
            trainer.load_state(items)
            return dict(meta["summary"]), trainer.params
    if resume and samples_path.is_file():
        episodes = load_episodes(samples_path)
    else:
        backend = ensure_backend(ctx)
        ids = [t for t in ctx.task_ids for _ in range(cfg.rft.samples_per_task)]
        sampling = rl_sampling(cfg, ())
        episodes, secs = run_phase(
            backend,
            collect_episodes(
                ids,
                ctx.make_env,
                backend.engine,
                ctx.tokenizer,
                sampling,
                cfg.agent,
                concurrency=cfg.env.max_parallel,
            ),
        )
        save_episodes(samples_path, episodes)
    kept = [e for e in episodes if e.resolved]
    solved = sorted({e.task_id for e in kept})
    scored = [e for e in episodes if e.infra_error is None]
    print(
        f"jaxswe rft: {len(kept)}/{len(scored)} trajectories resolved; "
        f"{len(solved)}/{len(ctx.task_ids)} tasks had at least one success"
    )
    metrics = MetricsLogger(stage_dir)
    rows = run_sft(trainer, [e.sft_sequence() for e in kept], cfg.sft, metrics, seed=cfg.seed, desc="rft sft")
    metrics.close()
    summary = {
        "name": "rft",
        "samples": len(episodes),
        "infra_failures": len(episodes) - len(scored),
        "sample_pass_rate": len(kept) / max(len(scored), 1),
        "trajectories_kept": len(kept),
        "tasks_with_success": len(solved),
        "tasks_total": len(ctx.task_ids),
        "sft_steps": len(rows),
        "final_loss": rows[-1]["loss"] if rows else None,
        "checkpoint": str(ckpts.directory),
    }
    ckpts.save(1, trainer.state(), {"stage": "rft", "summary": summary, "solved_tasks": solved})
    ckpts.close()
    return summary, trainer.params
