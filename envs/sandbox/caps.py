"""Whole-sandbox caps for the local backend, as root: memory and processes through a cgroup, disk
through a size-limited tmpfs.

Rlimits bound each process; these bound the sandbox as a whole (every process of every command,
and every byte it writes). A cgroup v2 directory under the unified hierarchy where its memory and
pids controllers are enabled, else one per cgroup v1 controller (`memory`, `pids`). Each command
joins it before it runs (`join`, from the child between fork and exec), so all it starts is
counted. The sandbox directory is a tmpfs of at most `disk` bytes, so checkout, home and /tmp
together cannot fill the host's disk. Without root or a writable hierarchy there is no cap:
`Caps.note` says so, and rlimits alone remain.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "jaxswe-sandboxes"


def _own(controller: str) -> str:
    """This process's cgroup path in `controller`'s hierarchy ("" for the unified one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path.lstrip("/")
    return ""


def _v2_parent() -> Path | None:
    """The sandboxes' parent under this process's own cgroup (so they stay inside its limits), with
    memory and pids enabled for its children."""
    if not (CGROUP_ROOT / "cgroup.controllers").is_file():
        return None
    own = CGROUP_ROOT / _own("")
    parent = own / PARENT
    try:
        _enable(own)  # fails where own holds processes (cgroup v2's no-internal-processes rule)
        parent.mkdir(exist_ok=True)
        _enable(parent)
        return parent
    except OSError:
        return None


def _enable(group: Path) -> None:
    control = group / "cgroup.subtree_control"
    if not {"memory", "pids"} <= set(control.read_text().split()):
        control.write_text("+memory +pids")


def _v1_parents() -> dict[str, Path] | None:
    parents = {}
    for controller in ("memory", "pids"):
        root = CGROUP_ROOT / controller
        if not (root / "cgroup.procs").is_file():
            return None
        parents[controller] = root / _own(controller) / PARENT
        try:
            parents[controller].mkdir(exist_ok=True)
        except OSError:
            return None
    return parents


def _make(group: Path, required: dict[str, int], optional: dict[str, int]) -> bool:
    try:
        group.mkdir()
        for file, value in required.items():
            (group / file).write_text(str(value))
        for file, value in optional.items():  # swap accounting, where the kernel has it
            with contextlib.suppress(OSError):
                (group / file).write_text(str(value))
        return True
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return False


@dataclass
class Caps:
    """A sandbox's cgroup directories (empty: none) and tmpfs mount (None: none), with a note on
    what could not be capped."""

    cgroups: tuple[Path, ...] = ()
    mount: Path | None = None
    note: str = ""

    def join(self) -> None:
        """Move the calling process into the sandbox's cgroups (between fork and exec)."""
        for group in self.cgroups:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    def release(self) -> None:
        """Remove the cgroups (their processes must be gone) and unmount the tmpfs (its files go)."""
        for group in self.cgroups:
            for _ in range(100):  # a killed process leaves its cgroup a moment after it dies
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
        if self.mount is not None:
            subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)


def create(name: str, directory: Path, *, memory: int, pids: int, disk: int) -> Caps:
    """Caps for the sandbox `name` whose (empty) directory is `directory` (see the module doc)."""
    if os.geteuid() != 0:
        return Caps(note="no whole-sandbox caps: not root (rlimits per process only)")
    notes, groups = [], []
    if (v2 := _v2_parent()) is not None:
        mem = {"memory.max": memory, "pids.max": pids}
        groups = [v2 / name] if _make(v2 / name, mem, {"memory.swap.max": 0}) else []
    elif (v1 := _v1_parents()) is not None:
        made = [
            _make(
                v1["memory"] / name,
                {"memory.limit_in_bytes": memory},
                {"memory.memsw.limit_in_bytes": memory},
            ),  # fmt: skip
            _make(v1["pids"] / name, {"pids.max": pids}, {}),
        ]
        groups = [v1[c] / name for c, ok in zip(("memory", "pids"), made, strict=True) if ok]
        if not all(made):
            Caps(cgroups=tuple(groups)).release()
            groups = []
    if not groups:
        notes.append("no memory/pids cgroup (no writable cgroup hierarchy)")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={disk},mode=0700,nosuid,nodev", "tmpfs", str(directory)],
        capture_output=True, text=True,
    )  # fmt: skip
    if mounted.returncode != 0:
        notes.append(f"no disk cap (tmpfs: {mounted.stderr.strip()[:200]})")
    return Caps(tuple(groups), directory if mounted.returncode == 0 else None, "; ".join(notes))


def release_stale(name: str, directory: Path) -> None:
    """Remove what `create` made for a sandbox whose owner is gone (reaping)."""
    groups = [CGROUP_ROOT / _own("") / PARENT / name]
    groups += [CGROUP_ROOT / c / _own(c) / PARENT / name for c in ("memory", "pids")]
    mounted = any(line.split()[1:2] == [str(directory)] for line in _mounts())
    Caps(tuple(g for g in groups if g.is_dir()), directory if mounted else None).release()


def _mounts() -> list[str]:
    try:
        return Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
