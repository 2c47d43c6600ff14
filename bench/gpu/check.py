"""One-command GPU check: every GPU figure of docs/performance.md measured in one run, one table.

    PYTHONPATH=. python3 bench/gpu/check.py              # on one H200, < 8 min; writes to $OUT or --out
    python bench/gpu/check.py --cpu-dry-run --out /tmp/c  # the same code at tiny shapes, on CPU

Sections, each in its own subprocess with its own time limit, so a crash, an out-of-memory or a
timeout loses only that section's rows (and a section keeps the rows it finished before it died):
- peaks: measured bf16 matmul TFLOP/s (8192^3, random data) and HBM GB/s (bytes read + written
  by a 4 GiB elementwise pass) -- the ceilings the other rows are read against;
- attention: packed causal GQA attention forward+backward (Qwen2.5-1.5B heads, bf16, one
  sequence per row) at 8K and 32K: the blockwise reference vs the fused Pallas kernel (and cuDNN,
  which takes no segment ids, as the ceiling a fused kernel can reach); the fused kernel's error
  against the reference comes first, so a fast wrong kernel shows;
- train_8k, train_32k: the bf16 SFT train step (fp32 master weights, AdamW, full remat, the
  attention training picks by default) of a Qwen2.5-1.5B-shaped model, 32K tokens per step:
  tokens/s, TFLOP/s counted as the planner counts (6 x matmul params x tokens + causal attention,
  recompute not counted), MFU against the measured matmul peak, the step time beside the one
  `jaxswe plan --compile` predicts (planner FLOPs at the assumed MFU), the device's peak memory
  against `sharding.planner`'s per-device total;
- decode: the embedded sampler's decode tokens/s at batch 32 (same model shape, bf16 weights);
- tiles: the fused kernel at 8K under a few other tilings, with whatever budget is left.

It needs only what the device image has (JAX, Flax, Optax, Chex, NumPy): no pydantic, no typer.
Output (incremental, rewritten after each section): check.md (the table), check.json (rows and
environment), check.log (every section's output).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {  # name -> time limit (s) on the GPU; the whole run is also capped (--budget)
    "peaks": 60,
    "attention": 150,
    "train_8k": 120,
    "train_32k": 150,
    "decode": 100,
    "tiles": 90,  # last: only what budget is left; rows kept as they finish
}
TOKENS_PER_STEP = 32768


# ---------------------------------------------------------------- measuring helpers (children)
# JAX and the project are imported inside the section functions only: the parent process must not
# start a JAX backend, which would take the GPU's memory (XLA preallocates) from the sections.


def _timed(fn, *args, min_iters=3, max_iters=20, budget_s=2.0):
    """(median seconds per call after one warm-up call, seconds of the warm-up incl. compile)."""
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    times: list[float] = []
    while len(times) < max_iters and (len(times) < min_iters or sum(times) < budget_s):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), first


def _peak_memory_bytes() -> int | None:
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


class Rows:
    """The rows of one section, saved to its result file after each one."""

    def __init__(self, section: str, path: Path):
        self.section, self.path, self.rows = section, path, []

    def add(self, name: str, value: float | None, unit: str, note: str = "", **extra) -> None:
        row = {"section": self.section, "name": name, "value": value, "unit": unit, "note": note, **extra}
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        self.path.write_text(json.dumps(self.rows))


def _model_config(dry: bool):
    from jaxswe.model.config import get_preset

    if dry:
        return get_preset("tiny", dtype="bfloat16", remat="full", attention_block=32, logprob_chunk=32)
    return get_preset("qwen2.5-1.5b", dtype="bfloat16", param_dtype="float32", remat="full")


# ---------------------------------------------------------------- sections


def section_peaks(rows: Rows, dry: bool, peaks: dict) -> None:
    import jax
    import jax.numpy as jnp

    n = 256 if dry else 8192
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = jax.random.normal(kb, (n, n), jnp.bfloat16)
    matmul = jax.jit(lambda a, b: a @ b)
    reps = 10

    def ten(a, b):
        return [matmul(a, b) for _ in range(reps)]  # dispatched back to back, timed together

    sec, _ = _timed(ten, a, b)
    tflops = 2 * n**3 * reps / sec / 1e12
    rows.add(f"bf16 matmul {n}^3", tflops, "TFLOP/s", "random data, 10 back to back", peak="matmul_tflops")
    size = (8 << 20) if dry else (4 << 30)
    x = jnp.ones((size // 2,), jnp.bfloat16)
    scale = jax.jit(lambda x: x * 2)
    sec, _ = _timed(scale, x)
    rows.add(f"HBM {size >> 20} MiB x*2", 2 * size / sec / 1e9, "GB/s", "bytes read + written")


def _attention_inputs(t: int, dry: bool):
    import jax
    import jax.numpy as jnp

    h, k, d = (4, 2, 16) if dry else (12, 2, 128)  # Qwen2.5-1.5B: 12 query / 2 kv heads of 128
    kq, kk, kv = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(kq, (1, t, h, d), jnp.bfloat16)
    kk_ = jax.random.normal(kk, (1, t, k, d), jnp.bfloat16)
    vv = jax.random.normal(kv, (1, t, k, d), jnp.bfloat16)
    pos = jnp.arange(t, dtype=jnp.int32)[None]
    seg = jnp.ones((1, t), jnp.int32)
    return q, kk_, vv, pos, seg


def _attention_fwd_bwd(impl: str, blocks=None):
    import jax
    import jax.numpy as jnp

    from sharding.flash import flash_attention
    from sharding.pallas_flash import Blocks

    blocks = blocks or Blocks()

    def loss(q, k, v, pos, seg, ct):
        if impl == "cudnn":
            out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        else:
            out, _ = flash_attention(
                q,
                k,
                v,
                q_positions=pos,
                kv_positions=pos,
                q_segment_ids=seg,
                kv_segment_ids=seg,
                impl=impl,
                pallas_blocks=blocks,
            )
        return jnp.sum(out.astype(jnp.float32) * ct), out

    return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))


def section_attention(rows: Rows, dry: bool, peaks: dict) -> None:
    import jax
    import jax.numpy as jnp

    from sharding.flash import on_nvidia_gpu

    lengths = (320,) if dry else (8192, 32768)  # 320: no multiple of the fused blocks
    impls = ["blockwise", "pallas"] + (["cudnn"] if on_nvidia_gpu() else [])
    for t in lengths:
        q, k, v, pos, seg = _attention_inputs(t, dry)
        ct = jax.random.normal(jax.random.key(2), q.shape, jnp.float32)
        h, d = q.shape[2], q.shape[3]
        flops = 3 * 4 * d * h * t * (t + 1) / 2  # 3 x forward (QK^T, PV over causal pairs)
        results, fns = {}, {impl: _attention_fwd_bwd(impl) for impl in impls}
        for impl, fn in fns.items():
            try:
                sec, first = _timed(
                    fn, q, k, v, pos, seg, ct, min_iters=1 if dry else 3, budget_s=1.0, max_iters=10
                )
            except Exception as err:  # one kernel failing keeps the others' rows
                rows.add(f"attention T={t} {impl}", None, "ms", f"failed: {type(err).__name__}: {err}"[:300])
                continue
            results[impl] = sec
            if impl == "pallas" and "blockwise" in results:
                (_, ref_out), ref_g = fns["blockwise"](q, k, v, pos, seg, ct)
                (_, out), g = fn(q, k, v, pos, seg, ct)
                rel = lambda a, b: float(
                    jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
                    / jnp.maximum(jnp.max(jnp.abs(b.astype(jnp.float32))), 1e-30)
                )
                errs = [rel(out, ref_out)] + [rel(a, b) for a, b in zip(g, ref_g, strict=True)]
                rows.add(
                    f"attention T={t} fused vs blockwise: max rel error (out, dq, dk, dv)",
                    max(errs),
                    "",
                    ", ".join(f"{e:.1e}" for e in errs),
                )
            note = f"{flops / sec / 1e12:.3g} TFLOP/s; compile+first {first:.1f} s"
            if impl != "blockwise" and "blockwise" in results:
                note += f"; {results['blockwise'] / sec:.2f}x blockwise"
            if impl == "pallas":
                note += " (goal >= 3x at 32K)"
            rows.add(f"attention fwd+bwd T={t} {impl}", sec * 1e3, "ms", note, tflops=flops / sec / 1e12)


def section_tiles(rows: Rows, dry: bool, peaks: dict) -> None:
    """The fused kernel's fwd+bwd at 8K under a few tilings (the defaults are untuned)."""
    from sharding.pallas_flash import Blocks

    t = 320 if dry else 8192
    q, k, v, pos, seg = _attention_inputs(t, dry)
    ct = q.astype("float32")
    h, d = q.shape[2], q.shape[3]
    flops = 3 * 4 * d * h * t * (t + 1) / 2
    candidates = [
        Blocks(),
        Blocks(fwd_warps=4),
        Blocks(stages=3),
        Blocks(fwd_q=64, fwd_kv=64),
        Blocks(fwd_q=128, fwd_kv=128, fwd_warps=8),
        Blocks(bwd_q=32, bwd_kv=128, bwd_warps=8),
        Blocks(bwd_q=128, bwd_kv=32, bwd_warps=8, stages=3),
    ]
    for blocks in candidates[:1] if dry else candidates:
        tiles = f"fwd {blocks.fwd_q}x{blocks.fwd_kv} w{blocks.fwd_warps}, bwd {blocks.bwd_q}x{blocks.bwd_kv} "
        tiles += f"w{blocks.bwd_warps}, stages {blocks.stages}"
        try:
            sec, _ = _timed(
                _attention_fwd_bwd("pallas", blocks), q, k, v, pos, seg, ct, min_iters=1 if dry else 3
            )
        except Exception as err:  # a tiling Triton cannot compile (shared memory, registers)
            rows.add(f"fused T={t} {tiles}", None, "ms", f"failed: {type(err).__name__}"[:200])
            continue
        rows.add(
            f"fused T={t} {tiles}",
            sec * 1e3,
            "ms",
            f"{flops / sec / 1e12:.3g} TFLOP/s",
            tflops=flops / sec / 1e12,
        )


def _train_section(rows: Rows, dry: bool, peaks: dict, seq_len: int) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from jaxswe.model.params import init_params
    from jaxswe.train import init_train_state, make_sft_step
    from sharding import make_mesh, make_rules
    from sharding.flash import resolve_impl
    from sharding.planner import PlanInput, plan

    cfg = _model_config(dry)
    tokens = 1024 if dry else TOKENS_PER_STEP
    if dry:
        seq_len //= 64  # 128 and 512
    rows_per_step = tokens // seq_len
    n_dev = jax.device_count()
    axes = {"fsdp": n_dev}
    mesh, rules = make_mesh(axes), make_rules()
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-5, weight_decay=0.1))
    step = make_sft_step(cfg, opt, mesh, rules, num_micro=1)
    params = jax.jit(lambda k: init_params(cfg, k), out_shardings=step.state_shardings.params)(
        jax.random.key(0)
    )
    state = init_train_state(params, opt, step.state_shardings)
    del params
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(0, cfg.vocab_size, (rows_per_step, seq_len)).astype(np.int32),
        "positions": np.tile(np.arange(seq_len, dtype=np.int32), (rows_per_step, 1)),
        "segment_ids": np.ones((rows_per_step, seq_len), np.int32),
        "loss_mask": np.ones((rows_per_step, seq_len), np.float32),
    }
    batch = jax.device_put(batch, step.batch_sharding)
    times = []
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    first = time.perf_counter() - t0
    for _ in range(1 if dry else 4):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    inp = PlanInput(
        model=cfg.planner_shape(),
        mesh={"fsdp": n_dev},
        seq_len=seq_len,
        rows=rows_per_step,
        remat=cfg.remat,
        param_dtype=cfg.param_dtype,
        compute_dtype=cfg.dtype,
        attention_block=cfg.attention_block,
        logprob_chunk=cfg.logprob_chunk,
    )
    p = plan(inp)
    tflops = p.model_flops / sec / 1e12
    peak = peaks.get("matmul_tflops")
    label = f"train step {seq_len // 1024}K" if seq_len >= 1024 else f"train step T={seq_len}"
    what = f"{rows_per_step} x {seq_len} tokens, attention {resolve_impl('auto')}"
    rows.add(
        f"{label} tokens/s", tokens / sec, "tok/s", f"{what}; {sec:.2f} s/step; compile+first {first:.0f} s"
    )
    rows.add(f"{label} TFLOP/s (6N + attention)", tflops, "TFLOP/s", f"{p.model_flops:.3e} FLOPs/step")
    rows.add(
        f"{label} step time vs predicted",
        sec,
        "s",
        f"predicted {p.step_time_s:.3g} s (`jaxswe plan --compile`'s: planner FLOPs with recompute at "
        f"{p.mfu:.0%} of {inp.peak_flops / 1e12:.0f} TFLOP/s); measured/predicted {sec / p.step_time_s:.2f}",
        predicted_s=p.step_time_s,
    )
    rows.add(
        f"{label} MFU vs measured peak",
        100 * tflops / peak if peak else None,
        "%",
        f"peak {peak:.3g} TFLOP/s measured (goal >= 40% at 8K)"
        if peak
        else "no measured peak (peaks failed)",
    )
    # XLA's memory analysis of the same program (CompiledMemory.peak's sum, written out here:
    # jaxswe.plan.compiled_memory needs pydantic, which the GPU image lacks)
    ma = step.jitted.lower(state, batch).compile().memory_analysis()
    compiler_peak = (
        ma.argument_size_in_bytes + ma.temp_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
    )
    measured = _peak_memory_bytes()
    planned = p.per_device_bytes["total"]
    rows.add(
        f"{label} peak memory vs planner",
        measured / 1e9 if measured else None,
        "GB",
        f"planner {planned / 1e9:.2f} GB"
        + (
            f"; planner/measured {planned / measured:.2f} (goal within 15%)"
            if measured
            else "; not reported here"
        )
        + f"; XLA's memory analysis {compiler_peak / 1e9:.2f} GB",
        planned_gb=planned / 1e9,
        compiler_gb=compiler_peak / 1e9,
        loss=float(jnp.asarray(metrics["loss"])),
    )


def section_train_8k(rows: Rows, dry: bool, peaks: dict) -> None:
    _train_section(rows, dry, peaks, 8192)


def section_train_32k(rows: Rows, dry: bool, peaks: dict) -> None:
    _train_section(rows, dry, peaks, 32768)


def section_decode(rows: Rows, dry: bool, peaks: dict) -> None:
    import dataclasses

    import jax
    import numpy as np

    from jaxswe.model.params import init_params
    from jaxswe.rollout.protocol import GenerateRequest
    from jaxswe.rollout.sampler import Sampler
    from jaxswe.rollout.types import SamplingParams

    cfg = dataclasses.replace(_model_config(dry), param_dtype="bfloat16")
    batch, prompt, new = (4, 8, 8) if dry else (32, 128, 256)
    params = jax.jit(lambda k: init_params(cfg, k))(jax.random.key(0))  # bf16, like served weights
    sampler = Sampler(cfg, params, seed=0, max_context=prompt + new + 16, cache_dtype="bfloat16")
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, prompt))
    reqs = [GenerateRequest(p.tolist(), SamplingParams(max_new_tokens=new)) for p in prompts]

    def run():
        gens = sampler.generate(reqs)
        return sum(len(g.output_ids) for g in gens)

    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    times, produced = [], 0
    for _ in range(1 if dry else 3):
        t0 = time.perf_counter()
        produced = run()
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    rows.add(
        f"sampler decode batch {batch}",
        produced / sec,
        "tok/s",
        f"prompt {prompt}, {new} new tokens per row (prefill included); compile+first {first:.0f} s",
    )


def _environment(dry: bool) -> dict:
    import jax

    env = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "dry_run": dry,
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [d.device_kind for d in jax.devices()],
    }
    for mod in ("jaxlib", "flax", "optax", "chex"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as err:  # a missing library is a fact of the environment, not a failure
            env[mod] = f"missing ({type(err).__name__})"
    return env


# ---------------------------------------------------------------- driver (parent)


def render(env: dict, rows: list[dict], status: dict[str, str]) -> str:
    versions = ", ".join(f"{k} {env.get(k)}" for k in ("jax", "jaxlib", "flax", "optax", "python"))
    dry = ", CPU DRY RUN" if env.get("dry_run") else ""
    head = f"GPU check {env.get('date', '')}: {', '.join(env.get('devices', []))} ({versions}{dry})"
    lines = [head, "", "| section | measurement | value | note |", "| --- | --- | --- | --- |"]
    for r in rows:
        v = r["value"]
        value = "-" if v is None else (f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}") + f" {r['unit']}".rstrip()
        lines.append(f"| {r['section']} | {r['name']} | {value} | {r['note']} |")
    for name, st in status.items():
        if st != "ok":
            lines.append(f"| {name} | section {st} | - | see check.log |")
    return "\n".join(lines) + "\n"


def _run_section(name: str, limit: float, result: Path, peaks: dict, dry: bool, log) -> str:
    """Run one section in a child process; its status ("ok", "failed (exit N)", "timed out ...")."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--result", str(result)]
    cmd += ["--peaks", json.dumps(peaks)] + (["--cpu-dry-run"] if dry else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if dry:  # tiny shapes on CPU: compile time is all there is, and what is checked is the code path
        env.update(JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1")
    log.write(f"\n===== {name} (limit {limit:.0f} s)\n")
    log.flush()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=limit)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        status = f"timed out after {limit:.0f} s"
    log.write(f"===== {name}: {status} in {time.monotonic() - t0:.0f} s\n")
    log.flush()
    print(f"{name}: {status} in {time.monotonic() - t0:.0f} s", flush=True)
    return status


def run_all(out: Path, dry: bool, budget_s: float, only: list[str]) -> int:
    """Every section in turn within `budget_s`; check.json / check.md rewritten after each."""
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))  # sections' own files stay out of $OUT
    deadline = time.monotonic() + budget_s * (3 if dry else 1)  # CPU limits are 3x, like the sections'
    rows: list[dict] = []
    status: dict[str, str] = {}
    env: dict = {"devices": ["unknown"]}
    peaks: dict = {}
    with open(out / "check.log", "w") as log:
        for name in ["env"] + [n for n in SECTIONS if not only or n in only]:
            limit = min(
                60 if name == "env" else SECTIONS[name] * (3 if dry else 1), deadline - time.monotonic()
            )
            if limit < 5:
                status[name] = "skipped (run budget spent)"
                continue
            result = work / f"{name}.json"
            status[name] = _run_section(name, limit, result, peaks, dry, log)
            got = json.loads(result.read_text()) if result.is_file() else None
            if name == "env":
                env = got or env
            elif got:
                rows += got
                peaks.update({r["peak"]: r["value"] for r in got if r.get("peak") and r["value"]})
            summary = {"environment": env, "rows": rows, "status": status}
            (out / "check.json").write_text(json.dumps(summary, indent=1))
            (out / "check.md").write_text(render(env, rows, {k: v for k, v in status.items() if k != "env"}))
    shutil.rmtree(work, ignore_errors=True)
    print((out / "check.md").read_text())
    return 0 if all(s == "ok" for s in status.values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-check", help="output dir (default $OUT)")
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on CPU: exercises every section")
    ap.add_argument(
        "--budget", type=float, default=470.0, help="seconds for the whole run (x3 for a dry run)"
    )
    ap.add_argument("--only", nargs="*", default=[], choices=list(SECTIONS), help="run only these sections")
    ap.add_argument("--section", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--peaks", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.section is None:
        return run_all(Path(args.out), args.cpu_dry_run, args.budget, args.only)
    if args.cpu_dry_run:
        os.environ["JAX_PLATFORMS"] = "cpu"
    result = Path(args.result)
    if args.section == "env":
        result.write_text(json.dumps(_environment(args.cpu_dry_run)))
        return 0
    section = globals()[f"section_{args.section}"]
    section(Rows(args.section, result), args.cpu_dry_run, json.loads(args.peaks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
