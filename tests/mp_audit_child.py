"""`python -m jaxswe ARGS...` that logs to LOG, one absolute path a line, every file this process
opens for writing or renames into place (Python's audit events `open`, `os.rename`, `os.replace`):
how the multi-process tests see which process wrote what. Writes from C++ (Orbax's tensorstore,
XLA's compilation cache) are not seen.

usage: python mp_audit_child.py LOG ARGS...
"""

import os
import runpy
import sys

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
log = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115 (open for the whole run)


def _path(value) -> str | None:
    return os.path.abspath(os.fsdecode(value)) if isinstance(value, str | bytes | os.PathLike) else None


def _record(event: str, args: tuple) -> None:
    if event == "open":
        path, mode, flags = args
        writes = (
            any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
        )
        if writes and (path := _path(path)):
            log.write(path + "\n")
    elif event in ("os.rename", "os.replace") and (path := _path(args[1])):
        log.write(path + "\n")


sys.addaudithook(_record)
sys.argv = ["jaxswe", *sys.argv[2:]]
runpy.run_module("jaxswe", run_name="__main__", alter_sys=True)
