"""Multi-process JAX: starting the processes' runtime and moving host data between them.

A stage runs as N processes (one per host), each driving its local devices; together they see
one global mesh. `initialize` starts `jax.distributed` from the CLI flags (`--coordinator
HOST:PORT --num-processes N --process-id I`) or, without flags, from a cluster that JAX detects
by itself (SLURM, Open MPI, Kubernetes), and does nothing on a single machine.

Work split (the decision, measured in docs/performance.md): rollouts run on process 0 only and
their episodes are broadcast to every process (`on_main`), so each process builds the same
batches and the run is the same for any process count. Episodes pickle to ~17 bytes per token
(docs/performance.md: ~1.5 GB for a 300 x 10 x 30K-token iteration, one collective of seconds
against tens of minutes of rollouts); the rollout engines (SGLang servers) and sandboxes scale
on their own hosts. Only process 0 writes files other than checkpoints and exported weights
(`is_main`).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxswe.errors import UserError

T = TypeVar("T")

# What jax.distributed's own cluster detection looks for (SLURM step, Open MPI's mpirun, a
# Kubernetes pod); with one of these set, `initialize()` without flags lets JAX find the rest.
_CLUSTER_ENV = {
    "SLURM": ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"),
    "Open MPI": ("OMPI_MCA_orte_hnp_uri",),
    "Kubernetes": ("KUBERNETES_SERVICE_HOST",),
}


class DistributedError(UserError):
    """Process flags that cannot start a multi-process run."""


def detected_cluster() -> str | None:
    """The cluster launcher that started this process as one of several, or None (a one-task
    SLURM step counts as none)."""
    for name, keys in _CLUSTER_ENV.items():
        if all(k in os.environ for k in keys):
            if name == "SLURM" and int(os.environ["SLURM_NTASKS"]) < 2:
                continue
            return name
    return None


def initialize(
    coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> None:
    """Start jax.distributed (before any other JAX call). With no argument: only under a detected
    cluster, with JAX's own detection; on one machine nothing happens."""
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise DistributedError("--coordinator, --num-processes and --process-id go together")
    if all(given):
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise DistributedError(
                f"--process-id {process_id} must be in [0, --num-processes {num_processes})"
            )
        if ":" not in coordinator:
            raise DistributedError(f"--coordinator {coordinator!r}: expected HOST:PORT")
        if num_processes == 1:
            return
        kwargs = dict(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    elif detected_cluster() is None:
        return
    else:
        kwargs = {}
    if _cpu_only():
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kwargs)


def _cpu_only() -> bool:
    return os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu"


def is_main() -> bool:
    """True on the process that runs rollouts and writes metrics, plots, summaries, trajectories."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reached `name` (no-op with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def broadcast(obj: T) -> T:
    """Process 0's `obj` on every process (any picklable value; others pass anything, e.g. None)."""
    if jax.process_count() == 1:
        return obj
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if is_main() else np.zeros(0, np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.int64(data.size)))
    buf = data if is_main() else np.zeros(size, np.uint8)
    out = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    return obj if is_main() else pickle.loads(out.tobytes())


def allgather_objects(obj: T) -> list[T]:
    """Every process's picklable `obj`, in process order, on every process (each pickled, padded
    to the largest and all-gathered as bytes)."""
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int64(data.size)))
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[: data.size] = data
    every = np.asarray(multihost_utils.process_allgather(buf))
    return [pickle.loads(every[i, : sizes[i]].tobytes()) for i in range(sizes.size)]


class ProcessZeroError(RuntimeError):
    """What the other processes raise when process 0 failed in `on_main`."""


class _Raised:
    """Process 0's exception, carried through `broadcast` (as text if it does not pickle)."""

    def __init__(self, err: BaseException):
        try:
            pickle.dumps(err)
            self.err = err
        except Exception:
            self.err = ProcessZeroError(f"{type(err).__name__}: {err}")


def _result(out: Any) -> Any:
    if isinstance(out, _Raised):
        raise out.err
    return out


def _share_failure(err: Exception) -> None:
    if jax.process_count() > 1:
        broadcast(_Raised(err))


def on_main(fn: Callable[[], T]) -> T:
    """Run `fn` on process 0 only and give its result to every process; when it raises, every
    process raises its exception (the others do not wait for a broadcast that never comes)."""
    if not is_main():
        return _result(broadcast(None))
    try:
        out = fn()
    except Exception as err:
        _share_failure(err)
        raise
    return broadcast(out)


async def on_main_async(coro_fn: Callable[[], Any]) -> Any:
    """`on_main` for a coroutine function (the other processes wait at the broadcast)."""
    if not is_main():
        return _result(broadcast(None))
    try:
        out = await coro_fn()
    except Exception as err:
        _share_failure(err)
        raise
    return broadcast(out)


def check_same_on_every_process(arrays: list[np.ndarray | None], what: str) -> None:
    """Raise when the host `arrays` differ between processes (compared by a SHA-256 digest): a
    global array built from host values takes each process's shards from its own copy, so copies
    that differ would be mixed silently. No-op with one process."""
    if jax.process_count() == 1:
        return
    h = hashlib.sha256()
    for x in arrays:
        x = np.ascontiguousarray(np.zeros(0) if x is None else x)
        h.update(f"{x.dtype}{x.shape}".encode())
        h.update(x.tobytes())
    digest = np.frombuffer(h.digest(), np.uint32)
    every = np.asarray(multihost_utils.process_allgather(digest))  # [processes, 8]
    differ = [i for i in range(every.shape[0]) if not np.array_equal(every[i], every[0])]
    if differ:
        raise RuntimeError(
            f"{what} differs between process 0 and processes {differ}: every process must build "
            "the same host data (a nondeterministic input pipeline?)"
        )


def to_host(x: jax.Array) -> np.ndarray:
    """The whole value of a (possibly multi-process) array as numpy on every process."""
    if x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
