"""Step time of a sharded DAPO step on 8 (fake CPU) devices vs the same step on one device.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/bench_sharding.py

Same global batch and model in both runs; the single-device run uses a 1-device mesh. Prints
one JSON line per setup with compile and median step seconds and the ratio to one device.
On fake CPU devices all "devices" share the host's cores, so the ratio measures the overhead
of partitioning and collectives, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from jaxswe.model import get_preset, init_params  # noqa: E402
from jaxswe.train import init_train_state, make_dapo_step  # noqa: E402
from sharding import make_mesh, make_rules  # noqa: E402


def make_batch(rows: int, length: int, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    half = length // 2
    return {
        "input_ids": rng.integers(0, vocab, (rows, length)).astype(np.int32),
        "positions": np.tile(np.concatenate([np.arange(half), np.arange(length - half)]), (rows, 1)).astype(
            np.int32
        ),
        "segment_ids": np.repeat(np.array([[1] * half + [2] * (length - half)], np.int32), rows, 0),
        "loss_mask": (rng.random((rows, length)) > 0.5).astype(np.float32),
        "old_logprobs": np.full((rows, length), -5.0, np.float32),
        "advantages": rng.normal(size=(rows, length)).astype(np.float32),
    }


def time_step(axes: dict[str, int], devices, cfg, batch, steps: int, num_micro: int) -> dict:
    mesh, rules = make_mesh(axes, devices), make_rules()
    opt = optax.adamw(1e-4)
    step = make_dapo_step(cfg, opt, mesh, rules, num_micro)
    state = init_train_state(init_params(cfg, jax.random.key(0)), opt, step.state_shardings)
    t0 = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t0)
    return {
        "mesh": {k: v for k, v in mesh.shape.items() if v > 1} or {"single": 1},
        "compile_s": round(compile_s, 2),
        "step_s": round(statistics.median(times), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--num-micro", type=int, default=1)
    args = ap.parse_args()
    cfg = get_preset(
        "tiny",
        hidden_size=128,
        intermediate_size=512,
        num_layers=4,
        num_heads=8,
        num_kv_heads=2,
        vocab_size=1024,
        attention_block=128,
        logprob_chunk=256,
        remat="full",
    )
    batch = make_batch(args.rows, args.length, cfg.vocab_size)
    base = time_step({"fsdp": 1}, jax.devices()[:1], cfg, batch, args.steps, args.num_micro)
    print(json.dumps(dict(base, ratio=1.0)))
    for axes in ({"fsdp": 8}, {"fsdp": 2, "context": 4}, {"data": 2, "fsdp": 2, "tensor": 2}):
        r = time_step(axes, jax.devices(), cfg, batch, args.steps, args.num_micro)
        print(json.dumps(dict(r, ratio=round(r["step_s"] / base["step_s"], 2))), flush=True)


if __name__ == "__main__":
    main()
