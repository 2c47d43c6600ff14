"""CLI commands `jaxswe rft | rl | eval | pipeline --config X --run-dir DIR [--set k=v ...] [--resume]`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from jaxswe.config import ConfigError, load_config
from jaxswe.run.loggers import check_trackers

ConfigOpt = Annotated[Path, typer.Option("--config", metavar="FILE", help="YAML config (configs/*.yaml)")]
RunDirOpt = Annotated[
    Path,
    typer.Option(
        "--run-dir", metavar="DIR", help="where the run writes everything (each stage in DIR/<stage>)"
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="override section.key=value (repeatable)"),
]
ResumeOpt = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="continue the run in --run-dir from its last complete checkpoint (refused when it holds no "
        "run; a finished stage keeps its summary and runs nothing)",
    ),
]
CoordinatorOpt = Annotated[
    str | None,
    typer.Option("--coordinator", metavar="HOST:PORT", help="HOST:PORT of process 0 (multi-process runs)"),
]
NumProcessesOpt = Annotated[
    int | None, typer.Option("--num-processes", metavar="N", help="JAX processes in the run")
]
ProcessIdOpt = Annotated[
    int | None, typer.Option("--process-id", metavar="I", help="this process's index, 0..N-1")
]
InitFromOpt = Annotated[
    str | None,
    typer.Option(
        "--init-from",
        metavar="DIR",
        help="start from this run dir (its newest stage), stage dir or checkpoints/",
    ),
]


TasksOpt = Annotated[
    Path | None,
    typer.Option(
        "--tasks",
        metavar="FILE",
        help="train and evaluate on every task of this JSON/JSONL file (sets env.tasks and env.eval_tasks "
        "and clears task_subset and eval.heldout; later --set values still apply)",
    ),
]


def task_file_overrides(tasks: Path | None) -> list[str]:
    """The `--set` overrides `--tasks FILE` stands for: the file as the stages' input, every task of it."""
    if tasks is None:
        return []
    if not tasks.is_file():
        raise ConfigError(f"--tasks {tasks}: no such task file")
    file = str(tasks.resolve())
    return [f"env.tasks={file}", f"env.eval_tasks={file}", "task_subset=null", "eval.heldout=[]"]


def _compile_cache() -> None:
    """Reuse XLA compilations across runs (resume, repeated stages): JAXSWE_COMPILE_CACHE, empty
    for none. Off with several processes on CPU: there an executable from the cache hangs in its
    first gloo collective (jax 0.10.2: a second 2-process `jaxswe rl` on the toy config hung in
    iteration 2's DAPO step, also with only process 0's cache warm)."""
    import jax

    path = os.environ.get("JAXSWE_COMPILE_CACHE", str(Path.home() / ".cache" / "jaxswe" / "xla"))
    if not path:
        return
    if jax.process_count() > 1 and jax.default_backend() == "cpu":
        if jax.process_index() == 0:
            print(
                "jaxswe: no XLA compile cache with several CPU processes (cached executables hang in gloo)",
                file=sys.stderr,
            )
        return
    jax.config.update("jax_compilation_cache_dir", path)
    # every program, not only those over jax's default 1 s: a run compiles dozens of small ones
    # (sampler buckets, steps), and a warm rerun of the toy config takes half the time
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def stage_dir_of(run_dir: Path, name: str) -> Path:
    """Where a stage command writes: RUN_DIR/<stage>, as the pipeline does (a run dir that is itself
    a stage dir, written before this layout, is resumed where it is)."""
    from jaxswe.errors import UserError
    from jaxswe.run.layout import is_stage_dir

    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir}: --run-dir is a file, not a directory")
    if is_stage_dir(run_dir):
        print(
            f"jaxswe: {run_dir} is a stage dir (an older layout): the {name} stage writes there",
            file=sys.stderr,
        )
        return run_dir
    return run_dir / name


def _newest_trained_stage(run_dir: Path) -> str | None:
    """What `jaxswe eval` evaluates without --init-from: the newest trained stage of --run-dir."""
    from jaxswe.run.layout import newest_trained_stage

    stage = newest_trained_stage(run_dir)
    return str(stage) if stage is not None else None


def _stage_command(name: str):
    def command(
        config: ConfigOpt,
        run_dir: RunDirOpt,
        set_: SetOpt = None,
        resume: ResumeOpt = False,
        init_from: InitFromOpt = None,
        tasks: TasksOpt = None,
        coordinator: CoordinatorOpt = None,
        num_processes: NumProcessesOpt = None,
        process_id: ProcessIdOpt = None,
    ) -> None:
        overrides = [*task_file_overrides(tasks), *(set_ or [])]
        cfg = load_config(config, overrides)  # before the heavy imports: a bad config fails at once
        check_trackers(cfg.logging.backends)
        if init_from:
            cfg = cfg.model_copy(update={"init_from": init_from})
        elif name == "eval" and not cfg.init_from:
            cfg = cfg.model_copy(update={"init_from": _newest_trained_stage(run_dir)})
        stage_dir = stage_dir_of(run_dir, name)
        if resume:
            from jaxswe.stages.stage_io import check_resumable

            check_resumable(stage_dir, f"{name} stage")
        from jaxswe.distributed import initialize
        from jaxswe.stages.stages import run_stage

        initialize(coordinator, num_processes, process_id)

        _compile_cache()
        summary = run_stage(name, cfg, stage_dir, init_from=cfg.init_from, resume=resume)
        typer.echo(json.dumps(summary, indent=2))

    command.__name__ = name
    command.__doc__ = {
        "rft": "Rejection fine-tuning: sample N per task, keep resolved trajectories, SFT.",
        "rl": "DAPO RL (stage 1, or stage 2 with rl.task_filter; rl.max_staleness > 0: asynchronous).",
        "eval": (
            "Pass@1 (95% interval) and Pass@k of a checkpoint or model.\n\n"
            "Weights, the first that applies: --init-from, the config's init_from, the newest trained "
            "stage in --run-dir (a pipeline's or stage command's run dir), model.path. A random init of "
            "model.preset is refused unless --set eval.allow_random_init=true. The weights evaluated are "
            "named on stderr and in summary.json (`weights`)."
        ),
    }[name]
    return command


def pipeline(
    config: ConfigOpt,
    run_dir: RunDirOpt,
    set_: SetOpt = None,
    resume: ResumeOpt = False,
    tasks: TasksOpt = None,
    coordinator: CoordinatorOpt = None,
    num_processes: NumProcessesOpt = None,
    process_id: ProcessIdOpt = None,
) -> None:
    """Run the config's stages in order, each in RUN_DIR/<stage> (warmstart, rft, rl, eval)."""
    cfg = load_config(config, [*task_file_overrides(tasks), *(set_ or [])])
    check_trackers(cfg.logging.backends)
    if resume:
        from jaxswe.stages.stage_io import check_resumable

        check_resumable(run_dir, "pipeline run")
    from jaxswe.distributed import initialize
    from jaxswe.stages.stages import run_pipeline

    initialize(coordinator, num_processes, process_id)

    _compile_cache()
    out = run_pipeline(cfg, run_dir, resume=resume)
    stages = [{"name": s["name"], "pass_at_1": s.get("pass_at_1")} for s in out["stages"]]
    typer.echo(json.dumps({"stages": stages, "paired": out["paired"]}))


def register(app: typer.Typer) -> None:
    for name in ("rft", "rl", "eval"):
        app.command(name)(_stage_command(name))
    app.command("pipeline")(pipeline)
