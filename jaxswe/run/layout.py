"""Run-dir layout: a stage dir (what one stage command writes) or a run dir whose subdirs are stages
(a pipeline's: RUN_DIR/<stage>/). One resolver for every command that takes either."""

from __future__ import annotations

from pathlib import Path

import yaml

# What every stage dir holds at least one of once the stage has started
STAGE_MARKERS = ("checkpoints", "metrics.jsonl", "trajectories")


def is_stage_dir(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and any((path / marker).exists() for marker in STAGE_MARKERS)


def sub_stages(run_dir: str | Path) -> list[Path]:
    """The stage dirs directly under `run_dir`, in run order: the order of the run's config.yaml
    `stages` list, stages it does not name after them by name; [] when there are none."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    order: list[str] = []
    config = run_dir / "config.yaml"
    if config.is_file():
        try:
            stages = (yaml.safe_load(config.read_text()) or {}).get("stages") or []
            order = [str(s) for s in stages] if isinstance(stages, list) else []
        except (yaml.YAMLError, AttributeError):
            order = []
    found = [d for d in run_dir.iterdir() if is_stage_dir(d)]
    return sorted(found, key=lambda d: (order.index(d.name) if d.name in order else len(order), d.name))


def holds_checkpoint(checkpoints: str | Path) -> bool:
    """Whether a checkpoints dir holds a committed step (a numbered subdir)."""
    checkpoints = Path(checkpoints)
    return checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())


def newest_trained_stage(run_dir: str | Path) -> Path | None:
    """The stage dir under `run_dir` whose checkpoints were written last (`run_dir` itself when it is
    a stage dir with checkpoints); None when no stage there holds a checkpoint."""
    run_dir = Path(run_dir)
    if holds_checkpoint(run_dir / "checkpoints"):
        return run_dir
    trained = [d for d in sub_stages(run_dir) if holds_checkpoint(d / "checkpoints")]
    return max(trained, key=lambda d: (d / "checkpoints").stat().st_mtime) if trained else None


def stage_dirs(path: str | Path) -> list[Path]:
    """`[path]` for a stage dir, a run dir's stages (`sub_stages`) otherwise."""
    return [Path(path)] if is_stage_dir(path) else sub_stages(path)
