"""Files every stage writes into its directory: resolved config, summary, success history."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jaxswe.config import RunConfig, dump_config
from jaxswe.distributed import is_main
from jaxswe.errors import UserError


def write_json(path: str | Path, obj: Any) -> None:
    """Atomic JSON write (a kill leaves either the old file or the new one); process 0 only."""
    if not is_main():
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def prepare_stage_dir(stage_dir: Path, cfg: RunConfig) -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    if is_main():
        dump_config(cfg, stage_dir / "config.yaml")


def load_history(path: str | Path) -> dict[str, list[int]]:
    """The success history saved by an RL run (its dir, stage dir, or history.json)."""
    path = Path(path)
    for candidate in (path, path / "history.json", path / "rl" / "history.json"):
        if candidate.is_file():
            return {k: [int(x) for x in v] for k, v in read_json(candidate).items()}
    raise UserError(f"{path}: no success history (history.json) found; is it an RL run dir?")
