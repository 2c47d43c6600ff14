"""One-command GPU check: every GPU figure of docs/performance.md measured in one run, one table.

    PYTHONPATH=. python3 bench/gpu/check.py              # on one H200, < 8 min; writes to $OUT or --out
    python bench/gpu/check.py --cpu-dry-run --out /tmp/c  # the same code at tiny shapes, on CPU

Sections, each in its own subprocess with its own time limit, so a crash, an out-of-memory or a
timeout loses only that section's rows (and a section keeps the rows it finished before it died):
- peaks: measured bf16 matmul TFLOP/s (8192^3, random data) and HBM GB/s (bytes read + written
  by a 4 GiB elementwise pass) -- the ceilings the other rows are read against;
- attention: packed causal GQA attention forward+backward (bf16, head dim 128, one sequence per
  row) at Qwen2.5-7B's 28/4 and Qwen2.5-72B's 64/8 query/kv heads: first the fused Pallas
  kernel's error against the blockwise reference at 8K for both (so a fast wrong kernel shows),
  then blockwise vs fused (and cuDNN, NVIDIA only, which takes no segment ids: the ceiling a fused
  kernel can reach) at 8K, and fused vs cuDNN at 32K;
- rl_7b: the RL step at Qwen2.5-7B's widths and heads (hidden 3584, intermediate 18944, vocab
  152064, 28/4 heads of 128) with 8 layers (RL_7B_LAYERS: fp32 masters, AdamW and activations
  come to about 64 GB by the planner, well inside one H200), one packed row of 32K tokens, the
  shipped RL config's settings (configs/qwen2.5-7b/rl-stage1.yaml, written out in RL_SETTINGS and
  held equal to the config by the test: remat, attention, logprob_chunk, dtypes, YaRN, optimizer,
  loss; make_rules()'s rules on the config's mesh axes, each of size 1) and the Trainer's own
  programs (`jaxswe.train.trainer.make_steps`): the recompute (the log-prob pass RL runs over the
  batch before its update) and the DAPO update (one optimizer step, advantages and the recomputed
  old log-probs in the batch; the rollout log-probs are read only with the off-policy correction,
  off as shipped), each timed beside the time `jaxswe plan --compile` predicts (planner FLOPs at
  the config's assumed MFU of its peak TFLOP/s), with TFLOP/s counted as the planner counts (6 x
  matmul params x tokens + causal attention, recompute not counted) and MFU against the measured
  matmul peak, and the device's peak memory beside `sharding.planner`'s per-device total for that
  shape (and XLA's memory analysis of the program);
- rl_72b: the DAPO update of one Qwen2.5-72B layer (hidden 8192, intermediate 29568, vocab
  152064, 64/8 heads) at 16K tokens, the same way;
- decode: the embedded sampler's decode tokens/s at batch 32 (Qwen2.5-1.5B shape, bf16 weights);
- tiles: the fused kernel at 8K (7B heads) under a few other tilings, with whatever budget is left.

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
    "peaks": 35,
    "attention": 120,
    "rl_7b": 180,
    "rl_72b": 100,
    "decode": 60,
    "tiles": 40,  # last: only what budget is left; rows kept as they finish
}
RL_7B_LAYERS = 8  # the planner's step total at 32K: about 64 GB of an H200's 141
RL_7B_TOKENS = 32768
RL_72B_TOKENS = 16384
# The shipped RL configs' settings, written out (jaxswe.config needs pydantic, which the GPU image
# lacks); tests/system/test_gpu_check.py holds them equal to configs/qwen2.5-{7b,72b}/rl-stage1.yaml.
RL_SETTINGS = {
    "model": {  # jaxswe.policy.model_knobs and stage_model's context
        "dtype": "bfloat16",
        "param_dtype": "float32",
        "grad_reduce_dtype": "float32",
        "remat": "full",
        "attention": "auto",
        "attention_block": 512,
        "logprob_chunk": 1024,
        "max_context": 65536,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    },
    "optimizer": {  # all but micro_batches (RL_MICRO_BATCHES)
        "lr": 1e-6,
        "b1": 0.9,
        "b2": 0.999,
        "eps": 1e-8,
        "weight_decay": 0.1,
        "decay_skip": ["norms", "biases"],
        "warmup_steps": 0,
        "schedule": "constant",
        "total_steps": None,
        "grad_clip": 1.0,
        "micro_batch_rows": 1,
        "grad_reduce_dtype": "float32",
    },
    "loss": {  # jaxswe.losses.LossSettings.from_rl(cfg.rl)
        "eps_low": 0.2,
        "eps_high": 0.3,
        "entropy_coef": 0.0,
        "tis_cap": None,
        "sequence_mask": "none",
        "mask_threshold": 2.0,
        "negative_weight": 1.0,
        "negative_prob_floor": 0.0,
    },
    "mesh": {  # the axes' names only: every size is 1 on one GPU
        "axes": ["data", "fsdp", "context", "tensor"],
        "rules": None,
        "context_attention": "ring",
        "gpu_memory_gb": 141.0,
        "memory_headroom": 0.1,
        "peak_tflops": 989.0,
        "mfu": 0.4,
    },
}
RL_MICRO_BATCHES = {"qwen2.5-7b": 64, "qwen2.5-72b": 4}
# query/kv heads of the attention rows; the dry run keeps the GQA groups (7 and 8 per kv head)
ATTENTION_HEADS = {"7B": (28, 4), "72B": (64, 8)}
DRY_ATTENTION_HEADS = {"7B": (7, 1), "72B": (8, 1)}


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


def _attention_inputs(t: int, heads: tuple[int, int], dry: bool):
    import jax
    import jax.numpy as jnp

    (h, k), d = heads, (16 if dry else 128)
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


def _heads_label(heads: tuple[int, int]) -> str:
    return f"{heads[0]}/{heads[1]} heads"


def section_attention(rows: Rows, dry: bool, peaks: dict) -> None:
    import jax
    import jax.numpy as jnp

    from sharding.flash import on_nvidia_gpu

    heads_of = DRY_ATTENTION_HEADS if dry else ATTENTION_HEADS
    short, long = (320, 320) if dry else (8192, 32768)  # 320: no multiple of the fused blocks
    cudnn = ["cudnn"] if on_nvidia_gpu() else []
    cases = [(short, heads, ["blockwise", "pallas"] + cudnn) for heads in heads_of.values()]
    cases += [(long, heads, ["pallas"] + cudnn) for heads in heads_of.values()]
    fns = {impl: _attention_fwd_bwd(impl) for impl in ("blockwise", "pallas", *cudnn)}
    inputs = {}

    def args_of(t, heads):
        if (t, heads) not in inputs:
            q, k, v, pos, seg = _attention_inputs(t, heads, dry)
            ct = jax.random.normal(jax.random.key(2), q.shape, jnp.float32)
            inputs[(t, heads)] = (q, k, v, pos, seg, ct)
        return inputs[(t, heads)]

    # first the fused kernel's error against the reference, at every head grouping
    rel = lambda a, b: float(
        jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
        / jnp.maximum(jnp.max(jnp.abs(b.astype(jnp.float32))), 1e-30)
    )
    for heads in heads_of.values():
        args = args_of(short, heads)
        name = (
            f"attention T={short} {_heads_label(heads)} fused vs blockwise: max rel error (out, dq, dk, dv)"
        )
        try:
            (_, ref_out), ref_g = fns["blockwise"](*args)
            (_, out), g = fns["pallas"](*args)
        except Exception as err:  # the timing rows below say which kernel failed
            rows.add(name, None, "", f"failed: {type(err).__name__}: {err}"[:300])
            continue
        errs = [rel(out, ref_out)] + [rel(a, b) for a, b in zip(g, ref_g, strict=True)]
        rows.add(name, max(errs), "", ", ".join(f"{e:.1e}" for e in errs))
    done = set()
    for t, heads, impls in cases:
        args = args_of(t, heads)
        h, d = heads[0], args[0].shape[3]
        flops = 3 * 4 * d * h * t * (t + 1) / 2  # 3 x forward (QK^T, PV over causal pairs)
        results = {}
        for impl in impls:
            if (t, heads, impl) in done:  # the dry run's two lengths are one
                continue
            done.add((t, heads, impl))
            name = f"attention fwd+bwd T={t} {_heads_label(heads)} {impl}"
            try:
                sec, first = _timed(fns[impl], *args, min_iters=1 if dry else 3, budget_s=1.0, max_iters=10)
            except Exception as err:  # one kernel failing keeps the others' rows
                rows.add(name, None, "ms", f"failed: {type(err).__name__}: {err}"[:300])
                continue
            results[impl] = sec
            note = f"{flops / sec / 1e12:.3g} TFLOP/s; first call {first:.1f} s"
            for ref in ("blockwise", "pallas"):
                if impl != ref and ref in results:
                    note += f"; {results[ref] / sec:.2f}x {ref}"
            rows.add(name, sec * 1e3, "ms", note, tflops=flops / sec / 1e12)


def section_tiles(rows: Rows, dry: bool, peaks: dict) -> None:
    """The fused kernel's fwd+bwd at 8K, 7B heads, under a few tilings (the defaults are untuned)."""
    from sharding.pallas_flash import Blocks

    t = 320 if dry else 8192
    heads = (DRY_ATTENTION_HEADS if dry else ATTENTION_HEADS)["7B"]
    q, k, v, pos, seg = _attention_inputs(t, heads, dry)
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
        name = f"fused T={t} {_heads_label(heads)} {tiles}"
        try:
            sec, _ = _timed(
                _attention_fwd_bwd("pallas", blocks), q, k, v, pos, seg, ct, min_iters=1 if dry else 3
            )
        except Exception as err:  # a tiling Triton cannot compile (shared memory, registers)
            rows.add(name, None, "ms", f"failed: {type(err).__name__}"[:200])
            continue
        rows.add(name, sec * 1e3, "ms", f"{flops / sec / 1e12:.3g} TFLOP/s", tflops=flops / sec / 1e12)


def _rl_model(preset: str, layers: int, dry: bool):
    """The preset's shape with `layers` layers and the shipped RL config's knobs and context; dry:
    tiny widths with the preset's query heads per kv head."""
    from jaxswe.model.config import get_preset

    s = RL_SETTINGS["model"]
    knobs = {k: v for k, v in s.items() if k not in ("max_context", "rope_scaling")}
    if dry:
        heads, kv = DRY_ATTENTION_HEADS["7B" if preset == "qwen2.5-7b" else "72B"]
        cfg = get_preset(
            "tiny",
            **dict(knobs, attention_block=32, logprob_chunk=32),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=16,
            tie_word_embeddings=False,
        )
    else:
        cfg = get_preset(preset, **knobs, num_layers=layers)
    return cfg.with_context(s["max_context"], s["rope_scaling"])


def _compiler_peak(compiled) -> int:
    """XLA's memory analysis of a compiled program (CompiledMemory.peak's sum, written out here:
    jaxswe.plan.compiled_memory needs pydantic)."""
    ma = compiled.memory_analysis()
    return (
        ma.argument_size_in_bytes + ma.temp_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
    )


def _memory_row(rows: Rows, name: str, planned: int, compiled, before: int | None) -> None:
    measured = _peak_memory_bytes()
    compiler = _compiler_peak(compiled)
    note = f"planner {planned / 1e9:.3g} GB"
    note += (
        f"; planner/measured {planned / measured:.2f} (goal within 15%)"
        if measured
        else "; not reported here"
    )
    note += f"; XLA's memory analysis {compiler / 1e9:.3g} GB"
    if before is not None:
        note += f"; high-water mark before this program {before / 1e9:.3g} GB"
    rows.add(
        name,
        measured / 1e9 if measured else None,
        "GB",
        note,
        planned_gb=planned / 1e9,
        compiler_gb=compiler / 1e9,
    )


def _rl_section(rows: Rows, dry: bool, peaks: dict, preset: str, layers: int, tokens: int, recompute: bool):
    """The shipped RL config's recompute pass (if `recompute`) and DAPO update on one device, at
    `preset`'s widths with `layers` layers and one packed row of `tokens` tokens."""
    import types

    import jax
    import numpy as np

    from jaxswe.losses import LossSettings
    from jaxswe.model.params import init_params
    from jaxswe.packing import TokenBatch, batch_bytes_per_token, step_fields
    from jaxswe.train import init_train_state
    from jaxswe.train.trainer import make_steps, trainer_mesh
    from sharding.flash import resolve_impl
    from sharding.planner import PlanInput, plan

    cfg = _rl_model(preset, layers, dry)
    mesh_s, opt_s = RL_SETTINGS["mesh"], RL_SETTINGS["optimizer"]
    opt_cfg = types.SimpleNamespace(**opt_s, micro_batches=RL_MICRO_BATCHES[preset])
    loss = LossSettings(**RL_SETTINGS["loss"])
    axes = dict.fromkeys(mesh_s["axes"], 1)
    mesh_cfg = types.SimpleNamespace(
        axes=axes, devices=1, rules=mesh_s["rules"], context_attention=mesh_s["context_attention"]
    )
    mesh, rules, attention = trainer_mesh(mesh_cfg)  # the Trainer's mesh and steps, on one device
    steps = make_steps(cfg, opt_cfg, mesh, rules, attention, loss)
    dapo = steps.dapo
    seq_len = tokens  # one packed row
    num_micro = 1  # one packed row is one micro-batch (as jaxswe.plan.plan_input counts rows)
    inp = PlanInput(
        model=cfg.planner_shape(),
        mesh=axes,
        seq_len=seq_len,
        rows=1,
        num_micro=num_micro,
        remat=cfg.remat,
        param_dtype=cfg.param_dtype,
        compute_dtype=cfg.dtype,
        grad_reduce_dtype=opt_s["grad_reduce_dtype"],
        rules=mesh_s["rules"],
        attention_block=cfg.attention_block,
        logprob_chunk=cfg.logprob_chunk,
        batch_token_bytes=batch_bytes_per_token(step_fields("dapo", off_policy=loss.off_policy)),
        device_memory_bytes=int(mesh_s["gpu_memory_gb"] * 1e9),
        headroom_fraction=mesh_s["memory_headroom"],
        peak_flops=mesh_s["peak_tflops"] * 1e12,
        mfu=mesh_s["mfu"],
    )
    p = plan(inp)
    rate = p.devices * inp.peak_flops * inp.mfu  # as `jaxswe plan --compile` predicts
    peak = peaks.get("matmul_tflops")
    size = "7B" if preset == "qwen2.5-7b" else "72B"
    t_label = f"{tokens // 1024}K" if tokens >= 1024 else f"T={tokens}"
    label = (
        f"RL {size} (hidden {cfg.hidden_size}, {cfg.num_heads}/{cfg.num_kv_heads} heads) x "
        f"{layers} layer{'s' if layers > 1 else ''}, {t_label}"
    )
    what = (
        f"1 x {seq_len} tokens, attention {resolve_impl(cfg.attention)}, remat {cfg.remat}, "
        f"{cfg.param_dtype} masters, {cfg.dtype} compute"
    )
    iters = 1 if dry else 3

    params = jax.jit(lambda k: init_params(cfg, k), out_shardings=dapo.state_shardings.params)(
        jax.random.key(0)
    )
    rng = np.random.default_rng(0)
    host = {
        "input_ids": rng.integers(0, cfg.vocab_size, (1, seq_len)).astype(np.int32),
        "positions": np.arange(seq_len, dtype=np.int32)[None],
        "segment_ids": np.ones((1, seq_len), np.int32),
        "loss_mask": np.ones((1, seq_len), np.float32),
        "advantages": rng.choice([-1.0, 1.0], (1, seq_len)).astype(np.float32),
    }
    put = lambda x: jax.device_put(x, dapo.batch_sharding)

    if recompute:
        lp_batch = {k: put(host[k]) for k in step_fields("logprobs")}
        t0 = time.perf_counter()
        lp = steps.logprobs.jitted.lower(params, lp_batch).compile()
        compile_s = time.perf_counter() - t0
        before = _peak_memory_bytes()  # params, batch, anything the compile's autotuning took
        sec, first = _timed(lp, params, lp_batch, min_iters=iters, max_iters=iters, budget_s=0)
        predicted = p.recompute_flops / rate
        tflops = p.recompute_flops / sec / 1e12
        rows.add(
            f"{label}: recompute time vs predicted",
            sec,
            "s",
            f"{what}; {seq_len / sec:,.0f} tok/s, {tflops:.3g} TFLOP/s"
            + (f" ({100 * tflops / peak:.0f}% of the measured peak)" if peak else "")
            + f"; predicted {predicted:.3g} s (planner FLOPs at {p.mfu:.0%} of "
            f"{inp.peak_flops / 1e12:.0f} TFLOP/s); measured/predicted {sec / predicted:.3g}; "
            f"compile {compile_s:.0f} s, first {first:.1f} s",
            predicted_s=predicted,
        )
        _memory_row(
            rows, f"{label}: recompute peak memory vs planner", p.recompute_bytes["total"], lp, before
        )
        old = np.asarray(jax.device_get(lp(params, lp_batch)[0]), np.float32)
        old_note = "old log-probs recomputed by the pass above"
        del lp_batch
    else:  # a fresh model's log-prob level: the ratio starts near 1, as after a real recompute
        old = np.full((1, seq_len), -np.log(cfg.vocab_size), np.float32)
        old_note = "old log-probs -log(vocab), not recomputed"
    host["old_logprobs"] = old
    host["rollout_logprobs"] = old + rng.normal(0, 0.01, old.shape).astype(np.float32)
    read = "read" if "rollout_logprobs" in dapo.fields else "not read (off-policy correction off, as shipped)"
    batch = {k: put(host[k]) for k in dapo.fields}
    state = init_train_state(params, steps.optimizer, dapo.state_shardings)
    del params
    dapo.check(TokenBatch.of(batch))  # the checks `Trainer.dapo_update` runs
    t0 = time.perf_counter()
    step = dapo.jitted.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    before = _peak_memory_bytes()  # the state's initialization (params copied, AdamW zeros) and more
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    first = time.perf_counter() - t0
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    tflops = p.model_flops / sec / 1e12
    rows.add(
        f"{label}: DAPO update time vs predicted",
        sec,
        "s",
        f"{what}; {seq_len / sec:,.0f} tok/s; predicted {p.step_time_s:.3g} s (`jaxswe plan --compile`'s: "
        f"planner FLOPs with recompute at {p.mfu:.0%} of {inp.peak_flops / 1e12:.0f} TFLOP/s); "
        f"measured/predicted {sec / p.step_time_s:.3g}; compile {compile_s:.0f} s, first {first:.1f} s; "
        f"{old_note}; rollout log-probs {read}",
        predicted_s=p.step_time_s,
        loss=float(metrics["loss"]),
    )
    rows.add(
        f"{label}: DAPO update MFU vs measured peak",
        100 * tflops / peak if peak else None,
        "%",
        f"{tflops:.3g} TFLOP/s (6N + attention: {p.model_flops:.3e} FLOPs/step)"
        + (
            f"; peak {peak:.3g} TFLOP/s measured"
            if peak
            else "; no measured peak (peaks failed or did not run)"
        ),
        tflops=tflops,
    )
    _memory_row(
        rows, f"{label}: DAPO update peak memory vs planner", p.per_device_bytes["total"], step, before
    )


def section_rl_7b(rows: Rows, dry: bool, peaks: dict) -> None:
    tokens = 512 if dry else RL_7B_TOKENS
    _rl_section(rows, dry, peaks, "qwen2.5-7b", 2 if dry else RL_7B_LAYERS, tokens, recompute=True)


def section_rl_72b(rows: Rows, dry: bool, peaks: dict) -> None:
    tokens = 256 if dry else RL_72B_TOKENS
    _rl_section(rows, dry, peaks, "qwen2.5-72b", 1, tokens, recompute=False)


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
