"""Start and stop SGLang servers (`python -m sglang.launch_server`) for a model exported by `save_hf`.

`sglang_command` builds the command line; `ServerProcess` runs any such command in its own
process group, waits for `GET /health`, and stops the whole group. SGLang needs CUDA, so tests run
`ServerProcess` with `jaxswe serve` as the stand-in server; the SGLang command itself is only
checked for its arguments in CI.

Supported SGLang: 0.5.9 (the `sglang` extra pins it; docs/guide.md, "SGLang version"). Seeds:
SGLang uses a request's `sampling_seed` only under `--enable-deterministic-inference` (0.5.9
`srt/sampling/sampling_batch_info.py`: the seed tensor is built only when that flag is set; with
it, `srt/server_args.py` forces the pytorch sampling backend, an attention backend in
flashinfer/fa3/triton and, for TP > 1, NCCL's tree all-reduce), so the command passes it whenever
`deterministic` is set (the config's `rollout.deterministic_inference`, on by default: every stage
seeds its requests). 0.5.7+ holds the seed as int64 and hashes all 64 bits (`srt/layers/utils/hash.py`),
so jaxswe's seeds in [0, 2**63) go through unchanged; 0.5.6 held it as int32.

Sampling: nothing here relies on the model's generation_config.json; `RolloutClient` sends every
sampling parameter on every request, which overrides whatever SGLang would default to. Output
log-probs are SGLang's default: temperature-scaled, before top-k/top-p/min-p (see
`jaxswe.rollout.sampling`); identical to the model's softmax at temperature 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxswe.errors import UserError


class LaunchError(UserError):
    """A rollout server that could not be started or did not become healthy."""


def sglang_command(
    model_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    tp_size: int = 1,
    mem_fraction_static: float = 0.85,
    context_length: int | None = None,
    rope_scaling: dict[str, Any] | None = None,
    dtype: str = "bfloat16",
    seed: int = 0,
    deterministic: bool = True,
    python: str = sys.executable,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The `sglang.launch_server` argv for a Hugging Face model directory.

    `rope_scaling` (e.g. {rope_type: yarn, factor: 4.0, original_max_position_embeddings: 32768})
    goes in through --json-model-override-args, with max_position_embeddings raised to
    `context_length` so SGLang accepts that context. Token ids in and out only
    (--skip-tokenizer-init): the agent never lets a server re-tokenize its history.
    `deterministic` adds --enable-deterministic-inference, without which SGLang ignores
    `sampling_seed` (see the module doc).
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise LaunchError(f"{model_dir}: not a Hugging Face model directory (no config.json)")
    if tp_size < 1:
        raise LaunchError(f"tp_size must be >= 1, got {tp_size}")
    if not 0 < mem_fraction_static <= 1:
        raise LaunchError(f"mem_fraction_static must be in (0, 1], got {mem_fraction_static}")
    cmd = [
        python, "-m", "sglang.launch_server",
        "--model-path", str(model_dir),
        "--host", host,
        "--port", str(port),
        "--tp-size", str(tp_size),
        "--mem-fraction-static", str(mem_fraction_static),
        "--dtype", dtype,
        "--random-seed", str(seed),
        "--skip-tokenizer-init",
    ]  # fmt: skip
    if deterministic:
        cmd.append("--enable-deterministic-inference")
    if context_length is not None:
        cmd += ["--context-length", str(context_length)]
    if rope_scaling:
        override: dict[str, Any] = {"rope_scaling": dict(rope_scaling)}
        if context_length is not None:
            override["max_position_embeddings"] = context_length
        cmd += ["--json-model-override-args", json.dumps(override, sort_keys=True)]
    return cmd + list(extra_args)


def stage_sglang_command(model_dir: str | Path, model_cfg: Any, rollout: Any, *, port: int) -> list[str]:
    """`sglang_command` for a stage: context length and RoPE scaling from the stage's model config
    (`jaxswe.stages.runtime.stage_model`, so stage 2 serves with YaRN), the rest from its rollout
    section."""
    rope = model_cfg.rope_scaling
    return sglang_command(
        model_dir,
        host=rollout.host,
        port=port,
        tp_size=rollout.tensor_parallel,
        mem_fraction_static=rollout.mem_fraction,
        context_length=model_cfg.max_position_embeddings,
        rope_scaling=None if rope is None else rope.to_hf(),
        dtype=model_cfg.dtype,
        seed=rollout.seed,
        deterministic=rollout.deterministic_inference,
    )


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


class ServerProcess:
    """One rollout server subprocess in its own process group, logging to `log_path`."""

    def __init__(
        self,
        cmd: Sequence[str],
        url: str,
        *,
        log_path: str | Path | None = None,
        env: dict[str, str] | None = None,
    ):
        self.cmd, self.url = list(cmd), url.rstrip("/")
        self.log_path = Path(log_path) if log_path else None
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                start_new_session=True,
            )
        except OSError as err:
            raise LaunchError(f"cannot start {self.cmd[0]}: {err}") from None
        finally:
            if self.log_path:
                log.close()
        return self

    def wait_healthy(self, timeout_s: float = 600.0, poll_s: float = 0.5) -> None:
        """Block until `GET /health` answers 200; raise (and stop the server) on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise LaunchError(
                    f"rollout server exited with code {code} before becoming healthy{self._tail()}"
                )
            if _healthy(self.url):
                return
            time.sleep(poll_s)
        self.stop()
        raise LaunchError(f"rollout server at {self.url} not healthy after {timeout_s:.0f}s{self._tail()}")

    def _tail(self) -> str:
        if not self.log_path or not self.log_path.is_file():
            return ""
        lines = self.log_path.read_text(errors="replace").strip().splitlines()[-5:]
        return ("; log tail: " + " | ".join(lines)) if lines else ""

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL after `grace_s`; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        with contextlib.suppress(ProcessLookupError, PermissionError):  # children left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_sglang(model_dir: str | Path, *, timeout_s: float = 900.0, log_path: str | Path | None = None,
                  **kwargs: Any) -> ServerProcess:  # fmt: skip
    """Build the SGLang command, start it and wait until it is healthy."""
    cmd = sglang_command(model_dir, **kwargs)
    host, port = kwargs.get("host", "127.0.0.1"), kwargs.get("port", 30000)
    server = ServerProcess(cmd, f"http://{host}:{port}", log_path=log_path).start()
    server.wait_healthy(timeout_s)
    return server
