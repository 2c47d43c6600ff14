"""Files every stage writes into its directory: resolved config (and its history), summary, success
history; the checks a run dir passes before anything is written."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from jaxswe.config import RunConfig, dump_config
from jaxswe.distributed import is_main
from jaxswe.errors import UserError
from jaxswe.run.files import write_json
from jaxswe.run.layout import StageDir
from jaxswe.run.metrics import read_rows

# Settings a resumed run cannot change: the checkpoints hold this model
FIXED_ON_RESUME = ("model.preset", "model.overrides", "model.path", "init_from")


def write_partial_summary(name: str, stage_dir: Path) -> None:
    """An interrupted stage's summary so far: the step (RL: iteration) its metrics reached, that
    row, and the checkpoint step a --resume starts from (None: from the start); process 0 only."""
    files = StageDir(stage_dir)
    rows = read_rows(files.metrics)
    ckpts = files.checkpoints
    saved = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.is_dir() else []
    summary = {
        "name": name,
        "interrupted": True,
        "steps_done": rows[-1]["step"] if rows else 0,
        "last_metrics": rows[-1] if rows else None,
        "resume_from_checkpoint": saved[-1] if saved else None,
    }
    write_json(files.partial_summary, summary)


def check_run_dir(run_dir: Path, *, resume: bool) -> None:
    """Refuse, before anything is written, a run dir that is not a directory, or one that holds a
    run when --resume is not given."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir}: --run-dir is a file, not a directory")
    if not resume and run_dir.is_dir() and any(run_dir.iterdir()):
        raise UserError(f"{run_dir} is not empty; pass --resume to continue it or choose a new --run-dir")


def check_resumable(run_dir: Path, what: str) -> None:
    """--resume needs a run to continue: refuse `run_dir` when it does not exist or is empty (what
    `check_run_dir` lets a new run start in), so a mistyped dir never starts a fresh run."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir, resume=True)  # a file
    if not (run_dir.is_dir() and any(run_dir.iterdir())):
        there = "does not exist" if not run_dir.exists() else f"is empty: no {what}"
        raise UserError(
            f"{run_dir}: nothing to resume ({there}); check --run-dir, or drop --resume to start a new run"
        )


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """section.key -> value (top-level values as themselves; values inside a section whole)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def config_changes(run_dir: Path, cfg: RunConfig) -> dict[str, list[Any]]:
    """Setting -> [recorded value, this run's value] for every setting that differs from the run
    dir's config.yaml (empty when there is none); refuses changes to FIXED_ON_RESUME."""
    saved = StageDir(run_dir).config
    if not saved.is_file():
        return {}
    old = _settings(yaml.safe_load(saved.read_text()) or {})
    new = _settings(cfg.model_dump(mode="json"))
    keys = sorted(old.keys() | new.keys())
    changes = {k: [old.get(k), new.get(k)] for k in keys if old.get(k) != new.get(k)}
    fixed = [k for k in changes if k in FIXED_ON_RESUME]
    if fixed:
        said = "; ".join(f"{k}: {changes[k][0]!r} -> {changes[k][1]!r}" for k in fixed)
        raise UserError(f"{run_dir}: --resume cannot change the model its checkpoints hold ({said})")
    return changes


def record_config(run_dir: Path, cfg: RunConfig) -> None:
    """Write config.yaml, the settings this run uses. A resumed run with other settings names each
    change on stderr and appends it to config_history.jsonl first, so the record of what trained
    the earlier checkpoints is never lost (the first run's line holds its whole config)."""
    files = StageDir(run_dir)
    files.path.mkdir(parents=True, exist_ok=True)
    if not is_main():
        return
    changes = config_changes(files.path, cfg)
    if not files.config.is_file():
        entry = {"time": _now(), "config": cfg.model_dump(mode="json")}
    elif changes:
        for key, (old, new) in changes.items():
            print(f"jaxswe: resumed with {key}: {old!r} -> {new!r}", file=sys.stderr)
        entry = {"time": _now(), "changes": changes}
    else:
        entry = None
    if entry is not None:
        with files.config_history.open("a") as f:
            f.write(json.dumps(entry) + "\n")
    dump_config(cfg, files.config)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def prepare_stage_dir(stage_dir: Path, cfg: RunConfig) -> None:
    record_config(stage_dir, cfg)
