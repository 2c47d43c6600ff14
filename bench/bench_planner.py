"""The planner (`jaxswe plan`) against the compiler, per shipped config and item.

    python bench/bench_planner.py [--backend cuda|cpu] [--configs configs/qwen2.5-7b/rl-stage1.yaml ...]

For each config, a subprocess compiles the real train step (DAPO for rl, SFT for rft, built by the
same factories as the Trainer) and the old-log-prob recompute pass with abstract inputs at the
config's full shapes on a mesh of the config's device count (`jaxswe.plan.compiled_memory`), and reads
XLA's memory analysis and, from the GPU compiler's buffer dump, what is live at the peak, by item.
The parent prints one table per config: planner GB, compiler GB and their ratio, item by item.

--backend cuda (default): deviceless ahead-of-time compilation for an H200 (compile-only CUDA
devices from a topology description; no GPU needed). It needs the jax CUDA PJRT plugin of the
installed jax version on the path, e.g.
    pip download --no-deps jax-cuda12-pjrt==$JAXV jax-cuda12-plugin==$JAXV -d /tmp/w
    pip install --no-deps --target /tmp/cuda-plugin /tmp/w/*.whl
    JAXSWE_CUDA_PLUGIN=/tmp/cuda-plugin python bench/bench_planner.py
(kept off the venv: an installed CUDA plugin makes every jax import probe for a GPU).
--backend cpu: fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=N). The CPU
backend upcasts bf16 arithmetic to f32, so its temporaries are not an H200's; it has no peak
breakdown either: only the totals are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted(ROOT.glob("configs/qwen2.5-*/*.yaml"))


def child(config: str, backend: str, dump: str) -> None:
    """Compile one config and print {"step": ..., "recompute": ...} as one JSON line."""
    import jax

    from jaxswe.config import load_config
    from jaxswe.plan.compiled_memory import (
        attention_kernel,
        compile_memory,
        conditionals,
        config_devices,
        cuda_devices,
        peak_items,
    )

    cfg = load_config(config)
    n = config_devices(cfg)
    devices = cuda_devices(n) if backend == "cuda" else jax.devices()[:n]
    out: dict = {k: v.to_json() for k, v in compile_memory(cfg, devices).items()}
    out["attention"] = attention_kernel(cfg, devices)
    for key, module in (("step", "jit_step"), ("recompute", "jit_run")):
        ranges = sorted(Path(dump).glob(f"*{module}*live-range.txt"))
        out[key]["peak_items"] = peak_items(ranges[-1].read_text()) if ranges else {}
        hlo = sorted(Path(dump).glob(f"*{module}*after_optimizations.txt"))
        out[key]["conditionals"] = conditionals(hlo[-1].read_text()) if hlo else None
    print(json.dumps(out))


def compile_config(config: Path, backend: str) -> dict:
    from jaxswe.config import load_config
    from jaxswe.plan.compiled_memory import config_devices

    n = config_devices(load_config(config))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as dump:
        if backend == "cuda":
            plugin = os.environ.get("JAXSWE_CUDA_PLUGIN")
            if not plugin:
                sys.exit("--backend cuda needs JAXSWE_CUDA_PLUGIN (see this file's docstring)")
            env.update(JAX_PLATFORMS="cpu", PYTHONPATH=f"{ROOT}{os.pathsep}{plugin}")
            env["XLA_FLAGS"] = (
                f"--xla_dump_to={dump} --xla_dump_hlo_module_re=.*jit_(step|run).*"
                " --xla_dump_hlo_pass_re=NONE"
            )
        else:
            env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
        cmd = [sys.executable, __file__, "--child", str(config), "--backend", backend, "--dump", dump]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode:
            sys.exit(f"{config}: compile failed\n{res.stderr[-3000:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])


def rows_of(config: Path, compiled: dict) -> list[tuple[str, float, float]]:
    """(item, planner bytes, compiler bytes) for one config."""
    from jaxswe.config import load_config
    from jaxswe.plan import plan_config

    p, _, _ = plan_config(load_config(config))
    pd, rc = p.per_device_bytes, p.recompute_bytes
    step, rec = compiled["step"], compiled["recompute"]
    peak = step.get("peak_items") or {}
    rows = [
        ("params", pd["params"], step["args_by_group"]["params"]),
        ("optimizer", pd["optimizer"], step["args_by_group"]["optimizer"]),
    ]
    # what is live at the peak instruction of XLA's live-range analysis (GPU dumps only); the
    # packed temp buffer the device allocates can be larger than that instant's live set
    for item in ("grads", "head_backward", "activations", "layer_recompute", "layout_copies"):
        if peak:
            rows.append((f"live at peak: {item}", pd.get(item, p.transients.get(item, 0)), peak.get(item, 0)))
    temps = pd["total"] - pd["params"] - pd["optimizer"] - pd["batch"]
    rows += [
        ("batch", pd["batch"], step["arguments"] - sum(step["args_by_group"].values())),
        ("step temporaries", temps, step["temporaries"]),
        ("step total", pd["total"], step["peak"]),
        (
            "recompute temporaries",
            rc["total"] - rc["params"] - rc["batch"] - rc["outputs"],
            rec["temporaries"],
        ),
        ("recompute total", rc["total"], rec["peak"]),
    ]
    return rows


def table(config: Path, rows: list[tuple[str, float, float]], compiled: dict) -> str:
    branches = ", ".join(f"{k} {compiled[k].get('conditionals', '?')}" for k in ("step", "recompute"))
    lines = [
        f"### {config.parent.name}/{config.name}",
        "",
        f"Attention kernel compiled: {compiled.get('attention', '?')}; conditionals in the optimized HLO: "
        f"{branches}.",
        "",
        "| item | planner GB | compiler GB | planner / compiler |",
        "|---|---:|---:|---:|",
    ]
    for name, planned, measured in rows:
        ratio = f"{planned / measured:.2f}" if measured > 1e6 else "-"
        lines.append(f"| {name} | {planned / 1e9:.2f} | {measured / 1e9:.2f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--configs", nargs="*", type=Path, default=CONFIGS)
    ap.add_argument("--child")
    ap.add_argument("--dump", default="")
    ap.add_argument("--json", type=Path, help="also write the compiler's numbers here")
    ap.add_argument("--from-json", type=Path, help="tables from a saved --json (no compiling)")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.backend, args.dump)
    sys.path.insert(0, str(ROOT))
    saved = json.loads(args.from_json.read_text()) if args.from_json else {}
    results = {}
    for config in args.configs:
        compiled = saved.get(str(config)) if saved else compile_config(config, args.backend)
        if compiled is None:
            continue
        results[str(config)] = compiled
        print(table(config, rows_of(config, compiled), compiled) + "\n", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
