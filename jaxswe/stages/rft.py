"""Rejection fine-tuning as the paper runs it: sample N trajectories per task with the current
model, keep the resolved ones, SFT on them for `sft.epochs` (1 by default: ceil(epochs x kept /
batch_size) steps, the cosine schedule decaying to 0 over exactly those steps; `sft.max_steps: 50`
is the paper's "50 steps"). Format-error turns stay in context, out of the loss. A one-shot
demonstration used while sampling (`agent.demonstration`) is not in the trained prompt unless
`agent.demonstration_in_trained_prompt`.

Resumable at every point: samples stream to `trajectories/samples.jsonl` as episodes finish and a
resumed collection runs only the missing (task, sample) slots; SFT saves an Orbax checkpoint every
`sft.checkpoint_every` steps and a resumed stage continues from the newest one on the same data
order; the final checkpoint holds the stage summary.
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from jaxswe.agent.episodes import collect_episodes
from jaxswe.agent.trajectory import Trajectory, TrajectoryError
from jaxswe.config import RunConfig
from jaxswe.distributed import barrier, is_main
from jaxswe.errors import UserError
from jaxswe.policy import Policy
from jaxswe.rollout.backends import run_phase
from jaxswe.rollout.types import derive_seed
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.run.files import write_text_atomic
from jaxswe.run.layout import StageDir
from jaxswe.run.loggers import stage_trackers
from jaxswe.run.metrics import MetricsLogger
from jaxswe.run.progress import Progress
from jaxswe.stages.context import StageContext
from jaxswe.stages.sft import num_sft_steps, run_sft
from jaxswe.train.trainer import Trainer


def rft_trainer(cfg: RunConfig, policy: Policy, num_steps: int | None = None) -> Trainer:
    """The RFT trainer: fp32 masters and AdamW moments (model.param_dtype) at rft.lr; with
    `num_steps`, a cosine schedule decays to 0 over exactly that many steps. It takes over the
    policy's params (one copy)."""
    update: dict[str, Any] = {"lr": cfg.rft.lr} if cfg.rft.lr else {}
    if num_steps and cfg.optimizer.schedule == "cosine":
        update["total_steps"] = num_steps
    return Trainer(
        policy.model_cfg, policy.hand_over(), cfg.optimizer.model_copy(update=update), mesh_cfg=cfg.mesh
    )


def _read_samples(path: Path, slots: list[str]) -> dict[int, Trajectory]:
    """The episodes already streamed to `path` by slot; a torn last line (a killed write) is
    dropped and the file rewritten clean. Raises when the file belongs to other tasks."""
    done: dict[int, Trajectory] = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # torn by a kill mid-write
        try:
            episode = Trajectory.from_json(row)
        except TrajectoryError as err:
            raise UserError(f"{path}: {err}") from None
        slot = int(episode.stage.get("slot", -1))
        if not 0 <= slot < len(slots) or episode.task_id != slots[slot]:
            raise UserError(
                f"{path}: sample {slot} is of task {episode.task_id!r}, not of this run's tasks "
                "(task list or rft.samples_per_task changed); use a new --run-dir"
            )
        done[slot] = episode
    if not is_main():
        return done
    write_text_atomic(path, "".join(_sample_line(i, e) for i, e in sorted(done.items())))
    return done


def _sample_line(slot: int, episode: Trajectory) -> str:
    """The JSONL line of sample `slot` (the slot in the record's stage bookkeeping)."""
    row = {**episode.to_json(), "stage": {**episode.stage, "slot": slot}}
    return json.dumps(row, ensure_ascii=False) + "\n"


def collect_samples(ctx: StageContext, path: Path) -> list[Trajectory]:
    """`rft.samples_per_task` episodes of every task, each appended to `path` as it finishes;
    slots already in `path` are not run again."""
    cfg = ctx.cfg
    slots = [t for t in ctx.task_ids for _ in range(cfg.rft.samples_per_task)]
    path.parent.mkdir(parents=True, exist_ok=True)
    barrier("rft samples ready")  # process 0 may have reset the file
    done = _read_samples(path, slots)
    barrier("rft samples read")  # every process runs the same slots
    todo = [i for i in range(len(slots)) if i not in done]
    if done:
        print(
            f"jaxswe rft: {len(done)}/{len(slots)} samples already collected; running {len(todo)}",
            file=sys.stderr,
        )
    if todo:
        backend = ctx.backend.serve()
        progress = Progress("rft sampling", len(slots), unit="episode", initial=len(done), enabled=is_main())
        resolved = sum(e.resolved for e in done.values())
        with path.open("a") if is_main() else contextlib.nullcontext() as out, progress:

            def stream(j: int, episode: Trajectory) -> None:  # process 0 only (it runs the episodes)
                nonlocal resolved
                out.write(_sample_line(todo[j], episode))
                out.flush()
                resolved += episode.resolved
                progress.update(resolved=resolved)

            episodes, _ = run_phase(
                backend,
                collect_episodes(
                    [slots[i] for i in todo],
                    ctx.make_env,
                    backend.engine,
                    ctx.tokenizer,
                    replace(ctx.sampling, sampling_seed=derive_seed(cfg.seed, "rft")),
                    cfg.agent,
                    concurrency=cfg.env.max_parallel,
                    on_done=stream,
                ),
            )
        done.update({todo[j]: e for j, e in enumerate(episodes)})  # every process gets them
    return [done[i] for i in range(len(slots))]


def run_rft(ctx: StageContext, *, resume: bool) -> tuple[dict[str, Any], Any]:
    """Returns the stage summary and the trained params."""
    cfg, stage_dir = ctx.cfg, ctx.stage_dir
    samples_path = StageDir(stage_dir).episodes("samples")
    ckpt_dir = StageDir(stage_dir).checkpoints
    if not resume and is_main():
        samples_path.unlink(missing_ok=True)
    episodes = collect_samples(ctx, samples_path)
    kept = [e for e in episodes if e.resolved]
    solved = sorted({e.task_id for e in kept})
    scored = [e for e in episodes if e.infra_error is None]
    print(
        f"jaxswe rft: {len(kept)}/{len(scored)} trajectories resolved; "
        f"{len(solved)}/{len(ctx.task_ids)} tasks had at least one success",
        file=sys.stderr,
    )
    steps = num_sft_steps(len(kept), cfg.sft)
    trainer = rft_trainer(cfg, ctx.policy, steps)
    ckpts = Checkpoints(ckpt_dir, max_to_keep=1)
    start = 0
    restored = ckpts.restore_latest(trainer.state()) if resume else None
    if restored is not None:
        start, items, meta = restored
        trainer.load_state(items)
        if "summary" in meta:  # the stage finished before
            ckpts.close()
            return dict(meta["summary"]), trainer.params
        print(f"jaxswe: resuming SFT after step {start} of {steps}", file=sys.stderr)
    metrics = MetricsLogger(stage_dir, start_step=start + 1, trackers=stage_trackers(cfg, stage_dir, "rft"))
    rows = run_sft(
        trainer,
        [e.sft_sequence() for e in kept],
        cfg.sft,
        metrics,
        seed=cfg.seed,
        desc="rft sft",
        start_step=start,
        checkpoint=lambda step: ckpts.save(step, trainer.state(), {"stage": "rft", "sft_step": step}),
    )
    metrics.close()
    summary = {
        "name": "rft",
        "samples": len(episodes),
        "infra_failures": len(episodes) - len(scored),
        "sample_pass_rate": len(kept) / max(len(scored), 1),
        "trajectories_kept": len(kept),
        "tasks_with_success": len(solved),
        "tasks_total": len(ctx.task_ids),
        "sft_steps": steps,
        "final_loss": rows[-1]["loss"] if rows else None,
        "checkpoint": str(ckpts.directory),
    }
    ckpts.save(steps, trainer.state(), {"stage": "rft", "summary": summary, "solved_tasks": solved})
    ckpts.close()
    return summary, trainer.params
