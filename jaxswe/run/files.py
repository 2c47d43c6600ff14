"""JSON files of a run: the atomic writer every stage file goes through, and its reader."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jaxswe.distributed import is_main


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
