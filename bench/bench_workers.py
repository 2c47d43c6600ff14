"""Episodes per minute with 1 vs 2 rollout workers behind the real sglang-router, in the same run.

    python bench/bench_workers.py [--episodes 32] [--rounds 2] [--concurrency 16] [--turns 3]

Two `jaxswe serve` workers (a tiny random Qwen2, float32, CPU) and two sglang-router processes
(pip `sglang-router`): one routes to worker 0 only, the other to both. Each round drives the
same episodes (the real agent loop, a `RolloutClient` to the router, local sandboxes of the
built-in tasks) through one router, then the other, alternating which goes first. The random model
answers noise, so every episode runs to `--turns` (format errors, never graded): the work is the
model's. Printed: episodes per minute per setup and round, and the 2-worker / 1-worker ratio of
the medians. On a machine with fewer cores than workers need, the ratio shows what routing costs,
not scale-out.

Start-up order matters with sglang-router 0.3.2: it probes each worker over HTTP and gRPC at once
and registers it only once one answers (the gRPC probe is the "PRI * HTTP/2.0" preface an HTTP
worker logs as a bad request; harmless), and it answers /health 200 before it knows any worker.
So the workers are waited for first, then each router until its /workers lists them healthy. Each
router exports its metrics on a port of its own: a second router on the default port (29000)
panics at start ("failed to install Prometheus metrics exporter"; this is what stopped the first
attempt at this bench, not the gRPC probe).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer in {timeout_s:.0f} s")


def wait_listed(router: str, count: int, timeout_s: float = 120.0) -> None:
    """Until the router's /workers lists `count` healthy workers."""
    import json

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(router + "/workers", timeout=2) as r:
                if sum(w.get("is_healthy", False) for w in json.loads(r.read())["workers"]) == count:
                    return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{router} did not list {count} healthy workers in {timeout_s:.0f} s")


def tiny_model(path: Path, vocab: int) -> None:
    import transformers

    cfg = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False,
    )  # fmt: skip
    import torch

    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(path, safe_serialization=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()

    from envs import load_tasks
    from jaxswe.agent.loop import run_episodes
    from jaxswe.agent.swe_env import SWEEnv
    from jaxswe.rollout.client import RolloutClient
    from jaxswe.rollout.types import SamplingParams
    from jaxswe.tokenizer import build_tokenizer

    tasks = load_tasks("builtin")
    tok = build_tokenizer([t.problem_statement for t in tasks] + [t.patch for t in tasks], 1000)
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny_model(Path(tmp) / "model", len(tok))
        workers = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
        try:
            for url in workers:
                cmd = ["-m", "jaxswe", "serve", "--model", f"{tmp}/model", "--port", url.rsplit(":", 1)[1],
                       "--max-batch", str(args.concurrency)]  # fmt: skip
                procs.append(subprocess.Popen([sys.executable, *cmd], stdout=subprocess.DEVNULL))
            for url in workers:
                wait_for(url + "/health")
            routers = {}
            for name, behind in (("1 worker", workers[:1]), ("2 workers", workers)):
                port = free_port()
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
                     str(port), "--worker-urls", *behind, "--policy", "round_robin", "--log-level", "warn",
                     "--prometheus-port", str(free_port())],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                ))  # fmt: skip
                routers[name] = f"http://127.0.0.1:{port}"
                wait_listed(routers[name], len(behind))

            async def drive(router: str) -> float:
                envs = [SWEEnv(tasks[i % len(tasks)], backend="local") for i in range(args.episodes)]
                async with RolloutClient(workers, router=router, timeout=600) as client:
                    t0 = time.perf_counter()
                    await run_episodes(
                        envs, client, tok, sampling=SamplingParams(max_new_tokens=64),
                        max_turns=args.turns, max_context_tokens=4096, concurrency=args.concurrency,
                    )  # fmt: skip
                    return args.episodes / (time.perf_counter() - t0) * 60

            asyncio.run(drive(routers["2 workers"]))  # warm-up: every worker compiles its buckets
            rates: dict[str, list[float]] = {name: [] for name in routers}
            for r in range(args.rounds):
                for name in list(routers)[:: 1 if r % 2 == 0 else -1]:
                    rates[name].append(asyncio.run(drive(routers[name])))
                    print(f"round {r + 1}, {name}: {rates[name][-1]:.1f} episodes/min", flush=True)
            one, two = (statistics.median(rates[n]) for n in ("1 worker", "2 workers"))
            print(f"| setup | episodes/min (median of {args.rounds}) |\n|---|---:|")
            print(f"| 1 worker | {one:.1f} |\n| 2 workers | {two:.1f} |\n| ratio 2 / 1 | {two / one:.2f} |")
        finally:
            for p in procs:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
