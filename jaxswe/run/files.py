"""Files of a run: the one atomic writer every stage file goes through, and the JSON reader."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jaxswe.distributed import is_main


def write_text_atomic(path: str | Path, text: str | Iterable[str]) -> None:
    """Write `text` (or its parts, one after the other) to `path` atomically: a kill leaves either
    the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.writelines([text] if isinstance(text, str) else text)
    os.replace(tmp, path)


def write_json(path: str | Path, obj: Any) -> None:
    """Atomic JSON write (`write_text_atomic`); process 0 only."""
    if is_main():
        write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())
