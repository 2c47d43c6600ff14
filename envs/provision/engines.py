"""A sandbox pool over many Docker engines: placement by load and capacity, health, failover.

Each engine (`EngineSpec`: a URL — unix://, tcp:// with TLS, ssh:// — or "default", the engine
DOCKER_HOST / the default socket names, and a capacity, the most sandboxes this process keeps on it
at once) holds a count of the sandboxes open on it. `EnginePool.open(task)` places a new sandbox on
the least-loaded healthy engine with a free slot (load = open / capacity; ties: fewer open, then the
order of the list), waiting while every healthy engine is full. The task's image is made on the
engine it lands on at its first use there (envs.provision.images, per client; cached per engine): the base
image and a task's published image, when the engine lacks them, are copied from an engine that has
them (`docker save | docker load` through this process), then the task image is built there.

Health: every engine is pinged (a short timeout, a fresh connection) every `health_interval_s` by a
daemon thread and whenever a call on it fails. An engine that fails two pings in a row, or a call
with a connection error (refused, aborted, timed out), is dead: no sandbox is placed on it and
every sandbox opened on it before raises `EngineError` at its next call (its command's result is
lost; the episode is an infrastructure failure, never the policy's). A sandbox whose container died
(`dead`, the policy's doing on a live engine) is checked the same way: when the engine does not
answer right after, the death was the engine's and the call raises `EngineError` instead. A dead
engine that answers a ping again rejoins: its containers left from before are removed, its image
cache is dropped, and new sandboxes go there again. When no engine answers for `dead_timeout_s`,
opening a sandbox raises `EngineError`.

`EngineError` is deliberately not a `SandboxError`: code that treats a SandboxError as the policy's
(a file the sandbox will not read is an observation) never swallows a dead engine. `grade()` turns
it into an infrastructure failure (`error`), the agent loop into an `infra_error` episode.

`configure(specs)` sets the process's default pool, which `open_sandbox(task, "docker")` and
`envs.provision.backends.reap("docker")` use (jaxswe does it from `env.docker_hosts`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envs.errors import EngineError, SandboxError

if TYPE_CHECKING:
    from envs.tasks.records import Task

DEFAULT = "default"
DEFAULT_CAPACITY = 8
PING_TIMEOUT_S = 3.0
HEALTH_INTERVAL_S = 10.0
DEAD_TIMEOUT_S = 120.0
DEATH_CONFIRM_S = 1.0  # a sandbox found dead: how long after its death the engine must answer


@dataclass(frozen=True)
class EngineSpec:
    """One Docker engine: where it answers and how many sandboxes this process keeps on it at once."""

    url: str = DEFAULT
    capacity: int = DEFAULT_CAPACITY
    name: str = ""  # shown in messages; default: the URL
    tls_verify: bool = True  # tcp:// with TLS: check the engine's certificate against tls_ca
    tls_ca: str | None = None
    tls_cert: str | None = None  # client certificate and key (mutual TLS)
    tls_key: str | None = None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return os.environ.get("DOCKER_HOST", "the default socket") if self.url == DEFAULT else self.url

    def client(self, timeout: float | None = None):
        """A docker SDK client of this engine (raises when it does not answer)."""
        import docker

        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if self.url == DEFAULT:
            return docker.from_env(**kwargs)
        tls: Any = False
        if self.tls_ca or self.tls_cert:
            cert = (self.tls_cert, self.tls_key) if self.tls_cert else None
            tls = docker.tls.TLSConfig(client_cert=cert, ca_cert=self.tls_ca, verify=self.tls_verify)
        elif self.url.startswith("tcp://") and self.tls_verify and self.url.endswith(":2376"):
            tls = True  # the TLS port without files: the system's CA bundle
        if isinstance(tls, docker.tls.TLSConfig) and tls.ca_cert:
            # requests lets $REQUESTS_CA_BUNDLE / $CURL_CA_BUNDLE override a session's CA file (its
            # trust_env): switch that off before the first call, then ask the engine its API version
            client = docker.DockerClient(
                base_url=self.url, tls=tls, version=docker.constants.DEFAULT_DOCKER_API_VERSION, **kwargs
            )
            client.api.trust_env = False
            client.api._version = client.api._retrieve_server_version()
            return client
        return docker.DockerClient(
            base_url=self.url, tls=tls, use_ssh_client=self.url.startswith("ssh://"), **kwargs
        )


def parse_specs(entries: Iterable[Any]) -> list[EngineSpec]:
    """EngineSpecs from URLs, dicts (EngineSpec fields) or EngineSpecs; names must be unique."""
    specs = []
    for entry in entries:
        if isinstance(entry, EngineSpec):
            specs.append(entry)
        elif isinstance(entry, str):
            specs.append(EngineSpec(url=entry))
        elif isinstance(entry, dict):
            specs.append(EngineSpec(**{k: v for k, v in entry.items() if v is not None}))
        else:
            specs.append(EngineSpec(**dict(entry)))  # a pydantic section
    for spec in specs:
        if spec.capacity < 1:
            raise SandboxError(f"Docker engine {spec.label}: capacity must be at least 1")
        if spec.url != DEFAULT and not spec.url.startswith(("unix://", "tcp://", "ssh://", "npipe://")):
            raise SandboxError(f"Docker engine URL {spec.url!r}: expected unix://, tcp:// or ssh://")
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise SandboxError(
            f"Docker engines listed twice: {sorted({x for x in labels if labels.count(x) > 1})}"
        )
    return specs


def _connection_error(err: BaseException) -> bool:
    """Whether `err` (or what caused it) is a failure to talk to the engine, not an answer from it."""
    import requests

    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                            ConnectionError, TimeoutError, EngineError)):  # fmt: skip
            return True
        if "Connection aborted" in str(err) or "Connection refused" in str(err):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


class Engine:
    """One engine's state in a pool: client, open sandboxes, health, image cache."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.name = spec.label
        self.in_use = 0
        self.healthy = True  # until a ping or a call says otherwise
        self.generation = 0  # incremented at each death: sandboxes of an older one are lost
        self.last_error = ""
        self.placed = 0  # sandboxes placed here over the pool's life
        self._client = None
        self._ping_client = None
        self._reaped = False
        self._images: dict[tuple, tuple[str, str]] = {}
        self._image_locks: dict[Any, threading.Lock] = {}
        self._lock = threading.Lock()
        self.orphans: list[str] = []  # containers left when the engine died (removed on rejoin)

    @property
    def client(self):
        client = self._client
        if client is None:  # made outside the lock: a slow engine must not hold up its pings
            client = self.spec.client()
            with self._lock:
                if self._client is None:
                    self._client = client
                elif self._client is not client:
                    with contextlib.suppress(Exception):
                        client.close()
                client = self._client
        return client

    def ping(self, timeout: float = PING_TIMEOUT_S) -> str | None:
        """None when the engine answers within `timeout`, else why not."""
        try:
            ping_client = self._ping_client
            if ping_client is None:
                ping_client = self._ping_client = self.spec.client(timeout=timeout)
            ping_client.ping()
            # a fresh connection next time: a stopping daemon still answers on open ones
            ping_client.api.close()
            return None
        except Exception as err:
            with self._lock:
                stale, self._ping_client = self._ping_client, None
            if stale is not None:
                with contextlib.suppress(Exception):
                    stale.close()
            return f"{type(err).__name__}: {err}"[:500]

    def image_lock(self, key: Any) -> threading.Lock:
        with self._lock:
            return self._image_locks.setdefault(key, threading.Lock())

    def forget(self) -> None:
        """Drop the client and the image cache (the engine died; it may come back empty)."""
        with self._lock:
            client, self._client = self._client, None
            self._images.clear()
            self._reaped = False
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def __repr__(self) -> str:
        state = "up" if self.healthy else f"dead ({self.last_error[:80]})"
        return f"Engine({self.name}, {self.in_use}/{self.spec.capacity}, {state})"


def _task_key(task: Task) -> tuple:
    return (
        task.instance_id,
        task.base_commit,
        task.image,
        task.remote_image,
        repr(sorted(task.install.items())),
    )


def copy_image(src, dst, tag: str) -> None:
    """Copy image `tag` from engine client `src` to `dst` (docker save | docker load, streamed)."""
    stream = src.images.get(tag).save(named=True)
    for _ in dst.api.load_image(stream):
        pass
    dst.images.get(tag)  # raises when the load did not produce it


class EnginePool:
    """Sandboxes placed over many Docker engines (see the module docstring)."""

    def __init__(
        self,
        specs: Sequence[Any],
        *,
        health_interval_s: float = HEALTH_INTERVAL_S,
        ping_timeout_s: float = PING_TIMEOUT_S,
        dead_timeout_s: float = DEAD_TIMEOUT_S,
    ):
        specs = parse_specs(specs) or [EngineSpec()]
        self.engines = [Engine(s) for s in specs]
        self.health_interval_s = health_interval_s
        self.ping_timeout_s = ping_timeout_s
        self.dead_timeout_s = dead_timeout_s
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self.events: list[tuple[float, str, str]] = []  # (time, engine, "dead: why" | "rejoined")

    # -- health -------------------------------------------------------------------------------
    def _start_health(self) -> None:
        """At the first placement: ping every engine, then keep pinging them in a daemon thread."""
        with self._cond:
            if self._started:
                return
            self._started = True
        self.check()
        if self.health_interval_s > 0:
            self._thread = threading.Thread(target=self._health_loop, name="jaxswe-engines", daemon=True)
            self._thread.start()

    def _health_loop(self) -> None:
        while not self._closed.wait(self.health_interval_s):
            self.check()

    def check(self) -> list[Engine]:
        """Ping every engine now (dead ones rejoin when they answer); the healthy engines."""
        for engine in self.engines:
            self.check_engine(engine)
        return [e for e in self.engines if e.healthy]

    def check_engine(self, engine: Engine, timeout: float | None = None) -> bool:
        """Ping `engine`; a healthy one is declared dead after two failed pings in a row, a dead one
        rejoins at its first answer. Whether it is healthy now."""
        why = engine.ping(timeout or self.ping_timeout_s)
        if why is not None and engine.healthy:  # one slow answer on a loaded host is not a death
            time.sleep(0.2)
            why = engine.ping(timeout or self.ping_timeout_s)
        if why is None and not engine.healthy:
            self._rejoin(engine)
        elif why is not None and engine.healthy:
            self.mark_dead(engine, why)
        return engine.healthy

    def mark_dead(self, engine: Engine, why: str) -> None:
        with self._cond:
            if not engine.healthy:
                return
            engine.healthy = False
            engine.generation += 1
            engine.last_error = why
            self.events.append((time.time(), engine.name, f"dead: {why}"))
            self._cond.notify_all()
        engine.forget()

    def _rejoin(self, engine: Engine) -> None:
        try:
            self._reap(engine)
        except Exception as err:  # answered the ping, failed the next call: still dead
            engine.last_error = f"{type(err).__name__}: {err}"[:500]
            return
        with self._cond:
            engine.healthy = True
            self.events.append((time.time(), engine.name, "rejoined"))
            self._cond.notify_all()

    def _reap(self, engine: Engine) -> list[str]:
        """Remove dead owners' containers on `engine` and this process's containers left from before
        its death (once per incarnation of the engine)."""
        from envs.sandbox.docker_sandbox import reap_containers

        if engine._reaped:
            return []
        removed = reap_containers(engine.client)
        while engine.orphans:
            name = engine.orphans.pop()
            with contextlib.suppress(Exception):
                engine.client.containers.get(name).remove(force=True)
                removed.append(name)
        engine._reaped = True
        return removed

    def reap(self) -> list[str]:
        """Reap every engine that answers (see _reap); the removed containers' names."""
        removed = []
        for engine in self.engines:
            if self.check_engine(engine):
                engine._reaped = False
                with contextlib.suppress(Exception):
                    removed += self._reap(engine)
        return removed

    # -- placement ----------------------------------------------------------------------------
    def _pick(self) -> Engine | None:
        free = [e for e in self.engines if e.healthy and e.in_use < e.spec.capacity]
        if not free:
            return None
        return min(free, key=lambda e: (e.in_use / e.spec.capacity, e.in_use, self.engines.index(e)))

    def acquire(self, timeout: float | None = None, stop: threading.Event | None = None) -> Engine:
        """A slot on the least-loaded healthy engine with room; waits while all are full. Raises
        EngineError when no engine answers for dead_timeout_s, `timeout` seconds pass, or `stop`
        is set (whoever waits gave up: an episode closed while its sandbox was opening)."""
        self._start_health()
        start = time.monotonic()
        last_check = 0.0
        with self._cond:
            while True:
                if stop is not None and stop.is_set():
                    raise EngineError("stopped waiting for a sandbox slot")
                engine = self._pick()
                if engine is not None:
                    engine.in_use += 1
                    engine.placed += 1
                    return engine
                waited = time.monotonic() - start
                if timeout is not None and waited >= timeout:
                    raise EngineError(f"no free sandbox slot on any Docker engine after {waited:.0f} s")
                if not any(e.healthy for e in self.engines):
                    if waited >= self.dead_timeout_s:
                        why = "; ".join(f"{e.name}: {e.last_error}" for e in self.engines)
                        raise EngineError(f"no Docker engine answers (waited {waited:.0f} s): {why}")
                    if time.monotonic() - last_check >= min(1.0, self.health_interval_s or 1.0):
                        self._cond.release()  # ping without holding the pool
                        try:
                            self.check()
                        finally:
                            self._cond.acquire()
                        last_check = time.monotonic()
                        continue
                self._cond.wait(0.5)

    def release(self, engine: Engine) -> None:
        with self._cond:
            engine.in_use -= 1
            self._cond.notify_all()

    def load(self) -> dict[str, tuple[int, int, bool]]:
        """{engine: (open sandboxes, capacity, healthy)}."""
        with self._cond:
            return {e.name: (e.in_use, e.spec.capacity, e.healthy) for e in self.engines}

    # -- images -------------------------------------------------------------------------------
    def _peer_with(self, tag: str, engine: Engine):
        from envs.provision.images import _has

        for other in self.engines:
            if other is engine or not other.healthy:
                continue
            with contextlib.suppress(Exception):
                if _has(other.client, tag):
                    return other.client
        return None

    def _ensure(self, engine: Engine, tag: str) -> bool:
        """Whether `engine` has `tag`, copying it from a peer engine that has it."""
        from envs.provision.images import _has

        with engine.image_lock(("tag", tag)):
            if _has(engine.client, tag):
                return True
            src = self._peer_with(tag, engine)
            if src is None:
                return False
            copy_image(src, engine.client, tag)
            return True

    def task_image(self, engine: Engine, task: Task) -> tuple[str, str]:
        """(image, shell init) of `task` on `engine` (made there at its first use; cached per engine)."""
        from envs.provision.images import BASE_IMAGE, task_image

        key = _task_key(task)
        with engine.image_lock(key):
            if key in engine._images:
                return engine._images[key]
            if not any(self._ensure(engine, name) for name in (task.image, task.remote_image) if name):
                self._ensure(engine, BASE_IMAGE)  # built there from the base
            found = engine._images[key] = task_image(task, client=engine.client)
            return found

    # -- sandboxes ----------------------------------------------------------------------------
    def open(
        self, task: Task, *, wait_s: float | None = None, stop: threading.Event | None = None, **limits: Any
    ) -> PooledSandbox:
        """A DockerSandbox of `task` (limits: DockerSandbox's, e.g. timeout, mem_limit) on a pool
        engine, waiting at most `wait_s` for a slot (None: as long as some engine answers) and not
        once `stop` is set; an engine that fails while the sandbox is being made is marked dead and
        the next one is tried."""
        from envs.sandbox.docker_sandbox import DockerSandbox

        tried: list[str] = []
        while True:
            engine = self.acquire(wait_s, stop)
            generation = engine.generation
            try:
                self._reap(engine)
                image, shell_init = self.task_image(engine, task)
                sandbox = DockerSandbox(
                    image, workdir=task.workdir, shell_init=shell_init, client=engine.client, **limits
                )
            except BaseException as err:
                self.release(engine)
                if not isinstance(err, Exception):
                    raise
                if _connection_error(err):
                    self.mark_dead(engine, f"{type(err).__name__}: {err}"[:500])
                elif self.check_engine(engine):
                    raise  # the engine answers: the failure is the task's or the image's
                tried.append(f"{engine.name}: {type(err).__name__}: {err}"[:300])
                if len(tried) >= 2 * len(self.engines):
                    raise EngineError("cannot open a sandbox on any engine: " + "; ".join(tried)) from None
                continue
            return PooledSandbox(self, engine, generation, sandbox)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ping_timeout_s + 1)
        for engine in self.engines:
            engine.forget()


class PooledSandbox:
    """A DockerSandbox on a pool engine: the same protocol, with engine failures raised as EngineError
    and the engine's slot given back at close."""

    def __init__(self, pool: EnginePool, engine: Engine, generation: int, sandbox: Any):
        self.pool, self.engine, self.generation, self.sandbox = pool, engine, generation, sandbox
        self._released = False

    def __getattr__(self, name: str) -> Any:  # workdir, image, id, container, dead, ...
        if "sandbox" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["sandbox"], name)

    def _lost(self, err: BaseException | None = None) -> EngineError:
        why = self.engine.last_error or (f"{type(err).__name__}: {err}" if err else "")
        return EngineError(
            f"Docker engine {self.engine.name} failed during this sandbox's life: {why}"[:1000]
        )

    def _alive(self) -> bool:
        return self.engine.healthy and self.engine.generation == self.generation

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._alive():
            raise self._lost()
        was_dead = getattr(self.sandbox, "dead", False)
        try:
            result = fn(*args, **kwargs)
        except Exception as err:
            if _connection_error(err):  # the call's result is lost; the next ping may rejoin it
                self.pool.mark_dead(self.engine, f"{type(err).__name__}: {err}"[:500])
                raise self._lost(err) from None
            if not self.pool.check_engine(self.engine):
                raise self._lost(err) from None
            raise
        if getattr(self.sandbox, "dead", False) and not was_dead:
            # the container died: the policy's doing only if the engine is still there
            time.sleep(DEATH_CONFIRM_S)
            if not self.pool.check_engine(self.engine) or not self._alive():
                raise self._lost()
        return result

    def exec(self, command: str, timeout: float | None = None):
        return self._call(self.sandbox.exec, command, timeout)

    def read_file(self, path: str, *args: Any, **kwargs: Any) -> str:
        return self._call(self.sandbox.read_file, path, *args, **kwargs)

    def write_file(self, path: str, content: str) -> None:
        return self._call(self.sandbox.write_file, path, content)

    def close(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            if self._alive():
                try:
                    self.sandbox.close()
                except Exception as err:
                    if not (_connection_error(err) or not self.pool.check_engine(self.engine)):
                        raise
                    self._orphan()  # removed when the engine answers again
            else:  # the engine died under it: its container goes when the engine comes back
                self.sandbox._closed = True
                self._orphan()
        finally:
            self.pool.release(self.engine)

    def _orphan(self) -> None:
        name = getattr(getattr(self.sandbox, "container", None), "name", None)
        if name:
            self.engine.orphans.append(name)

    def __enter__(self) -> PooledSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not self.__dict__.get("_released", True):
            with contextlib.suppress(Exception):
                self.close()


_DEFAULT: EnginePool | None = None
_DEFAULT_LOCK = threading.Lock()


def configure(specs: Sequence[Any] | None, **options: Any) -> EnginePool | None:
    """Set the process's default pool from `specs` (empty/None: no pool, the single default engine)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        old, _DEFAULT = _DEFAULT, (EnginePool(specs, **options) if specs else None)
    if old is not None:
        old.close()
    return _DEFAULT


def default_pool() -> EnginePool | None:
    return _DEFAULT


def ensure_configured(specs: Sequence[Any] | None, **options: Any) -> EnginePool | None:
    """The default pool of `specs`: the current one when it has the same engines, else a new one."""
    wanted = parse_specs(specs or [])
    current = _DEFAULT
    if current is not None and [e.spec for e in current.engines] == wanted:
        return current
    if current is None and not wanted:
        return None
    return configure(wanted, **options)
