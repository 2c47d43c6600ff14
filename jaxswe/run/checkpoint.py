"""Orbax checkpoints of a stage: named pytrees (params, optimizer state) plus JSON `meta`.

`save` commits before it returns; `save(..., wait=False)` returns once the arrays are copied to
host memory (Orbax's D2H copy blocks inside `save`, so the caller may then donate or overwrite
them) and writes in a background thread. Every later call (`save`, `steps`, `restore`, `close`)
first waits for that write. Orbax writes to a temporary directory and renames it on commit, so a
killed save, synchronous or not, leaves nothing that looks complete.
`restore_latest` walks back from the newest step when one cannot be read (corrupt or partial):
it says so on stderr and moves that step aside into `unreadable/` (so the next save of that step
number does not collide with it); when every step is unreadable it raises instead of letting a
resumed run silently start over.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxswe.errors import UserError
from jaxswe.run.layout import StageDir, holds_checkpoint, newest_trained_stage


class CheckpointError(UserError):
    """No usable checkpoint where one is needed."""


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:200] if lines else ""


def _manager(directory: str | Path, max_to_keep: int | None = None) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        enable_async_checkpointing=True,
        # a background write may take long (a 72B state is ~1.16 TB); Orbax's default is 20 min
        async_options=ocp.AsyncOptions(timeout_secs=3 * 3600),
        create=True,
    )
    return ocp.CheckpointManager(Path(directory).absolute(), options=options)


class Checkpoints:
    """The checkpoint directory of one stage (`<stage dir>/checkpoints`)."""

    def __init__(self, directory: str | Path, *, max_to_keep: int | None = 3):
        self.directory = Path(directory).absolute()
        self._mgr = _manager(self.directory, max_to_keep)

    def steps(self) -> list[int]:
        """Committed steps, oldest first."""
        self._mgr.wait_until_finished()
        self._mgr.reload()
        return sorted(self._mgr.all_steps())

    def save(self, step: int, items: dict[str, Any], meta: dict[str, Any], *, wait: bool = True) -> None:
        """Commit each named pytree of arrays in `items` and the JSON-able `meta` as `step`; with
        `wait=False` return once the arrays are on host and commit in the background."""
        args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
        meta = json.loads(json.dumps(meta))  # a snapshot: a background write reads it later
        self._mgr.save(step, args=ocp.args.Composite(meta=ocp.args.JsonSave(meta), **args), force=True)
        if wait:
            self._mgr.wait_until_finished()

    def restore(self, step: int, abstract_items: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Read the named items of `step` (others stay on disk) and its meta; each abstract tree gives
        structure, shapes, dtypes (and shardings)."""
        self._mgr.wait_until_finished()
        args = {
            name: ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, tree))
            for name, tree in abstract_items.items()
        }
        out = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore(), **args))
        return {name: out[name] for name in abstract_items}, dict(out["meta"])

    def restore_latest(
        self, abstract_items: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """Newest readable checkpoint as (step, items, meta), or None when there is no step at all.

        Unreadable steps are moved to `<directory>/unreadable/`; CheckpointError when none is readable.
        """
        steps = self.steps()
        for step in reversed(steps):
            try:
                items, meta = self.restore(step, abstract_items)
            except Exception as err:  # any read failure means this step is unusable
                aside = self._move_aside(step)
                print(
                    f"jaxswe: checkpoint {self.directory / str(step)} is unreadable "
                    f"({type(err).__name__}: {_first_line(err)}); moved to {aside}, using the previous one",
                    file=sys.stderr,
                )
                continue
            return step, items, meta
        if steps:
            raise CheckpointError(
                f"{self.directory}: no checkpoint is readable (steps {steps} moved to "
                f"{self.directory / 'unreadable'}); restore one or start a new --run-dir"
            )
        return None

    def _move_aside(self, step: int) -> Path:
        target = self.directory / "unreadable" / f"{step}-{int(time.time())}"
        target.parent.mkdir(parents=True, exist_ok=True)
        (self.directory / str(step)).rename(target)
        self._mgr.reload()
        return target

    def close(self) -> None:
        self._mgr.close()


def find_checkpoint_dir(path: str | Path) -> Path:
    """Resolve a stage dir, a checkpoints dir, or a pipeline's run dir (its newest stage, named on
    stderr) to the checkpoints dir.

    Raises CheckpointError naming the path when it holds no committed checkpoint.
    """
    path = Path(path)
    if holds_checkpoint(path):
        return path.absolute()
    stage = newest_trained_stage(path)
    if stage is not None:
        if stage != path:
            print(f"jaxswe: {path} holds stages; using the newest, {stage.name}", file=sys.stderr)
        return StageDir(stage).checkpoints.absolute()
    raise CheckpointError(f"{path}: no checkpoint found (expected a run dir, a stage dir or checkpoints/)")
