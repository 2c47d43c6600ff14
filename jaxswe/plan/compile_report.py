"""`jaxswe plan --compile`: the compiler's figures for a config's training stage beside the planner's.

A child process (`python -m jaxswe.plan.compile_report`) compiles the real train step and recompute pass
(`jaxswe.plan.compiled_memory.compile_programs`) on the target's devices, chosen before jax starts:
- `h200`: a deviceless H200 of the config's device count (compile-only CUDA devices, no GPU). It
  needs the jax CUDA PJRT plugin of the installed jax, in a directory that JAXSWE_CUDA_PLUGIN names
  (kept off the venv: an installed plugin makes every jax import probe for a GPU).
- `cpu`: fake host CPU devices. The CPU backend upcasts bf16 to float32 and packs buffers its own
  way: its bytes are not an H200's (for small configs and tests).
Per program: the attention kernel, `conditional` ops in the optimized HLO (each one a host sync on a
GPU), XLA's per-device peak beside the planner's, and a predicted time: the planner's FLOPs at the
config's assumed utilization (`mesh.mfu` of `mesh.peak_tflops`), not XLA's cost analysis.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from jaxswe.config import RunConfig
from jaxswe.plan import PlanError, plan_config

TARGETS = ("h200", "cpu")
PROGRAMS = {"step": "train step", "recompute": "recompute"}
_ROOT = Path(__file__).resolve().parent.parent  # the directory that holds jaxswe and sharding


def plugin_dir() -> str:
    """JAXSWE_CUDA_PLUGIN if it holds the jax CUDA plugin, else a PlanError saying how to get it."""
    plugin = os.environ.get("JAXSWE_CUDA_PLUGIN", "")
    if plugin and (Path(plugin) / "jax_plugins").is_dir():
        return plugin
    v = metadata.version("jax")
    raise PlanError(
        f"--compile for an H200 needs the jax CUDA plugin (JAXSWE_CUDA_PLUGIN={plugin or 'unset'}): "
        f"pip download --no-deps jax-cuda12-pjrt=={v} jax-cuda12-plugin=={v} -d /tmp/w && "
        "pip install --no-deps --target /tmp/cuda-plugin /tmp/w/*.whl, "
        "then JAXSWE_CUDA_PLUGIN=/tmp/cuda-plugin "
        "(or --target cpu: fake host CPU devices, whose bytes are not an H200's)"
    )


def _child_env(target: str, devices: int) -> dict[str, str]:
    paths = [str(_ROOT)] + ([plugin_dir()] if target == "h200" else [])
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if "force_host_platform_device_count" not in f]
    if target == "cpu":
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    pythonpath = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=pythonpath, XLA_FLAGS=" ".join(flags))


def _compile_child(request: dict[str, Any]) -> dict[str, Any]:
    """In the child: compile both programs, write their HLO if asked, return what the compiler said."""
    import jax

    from jaxswe.config import load_config
    from jaxswe.plan.compiled_memory import (
        analyse,
        attention_kernel,
        compile_programs,
        conditionals,
        config_devices,
        cuda_devices,
    )

    cfg = load_config(request["config"], request["overrides"])
    n = config_devices(cfg)
    devices = cuda_devices(n) if request["target"] == "h200" else jax.devices()[:n]
    hlo_dir = Path(request["hlo_dir"]) if request["hlo_dir"] else None
    out: dict[str, Any] = {"kernel": attention_kernel(cfg, devices), "programs": {}}
    for name, (compiled, groups) in compile_programs(cfg, devices, request["stage"]).items():
        text = compiled.as_text()
        prog = dict(analyse(compiled, groups).to_json(), conditionals=conditionals(text))
        if hlo_dir is not None:
            hlo_dir.mkdir(parents=True, exist_ok=True)
            path = hlo_dir / f"{name}.hlo.txt"
            path.write_text(text)
            prog["hlo"] = str(path)
        out["programs"][name] = prog
    return out


def compile_report(
    config: Path, overrides: list[str], cfg: RunConfig, stage: str | None, target: str, hlo_dir: Path | None
) -> dict[str, Any]:
    """Compile the config's stage for `target` in a child process; the compiler's figures, the
    planner's beside them and the predicted time of each program."""
    if target not in TARGETS:
        raise PlanError(f"--target {target!r}: one of {', '.join(TARGETS)}")
    p, inp, _ = plan_config(cfg, stage)
    request = {
        "config": str(config),
        "overrides": overrides,
        "stage": stage,
        "target": target,
        "hlo_dir": str(hlo_dir.resolve()) if hlo_dir else None,
    }
    env = _child_env(target, p.devices)
    cmd = [sys.executable, "-m", "jaxswe.plan.compile_report", json.dumps(request)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode:
        last = [ln for ln in res.stderr.splitlines() if ln.strip()][-1:] or [f"exit status {res.returncode}"]
        raise PlanError(f"{config}: the {target} compile failed: {last[0]}")
    compiled = json.loads(res.stdout.strip().splitlines()[-1])
    rate = p.devices * inp.peak_flops * inp.mfu  # hardware FLOP/s assumed for the whole mesh
    planner = {
        "step": (p.per_device_bytes["total"], p.hardware_flops, p.model_flops),
        "recompute": (p.recompute_bytes["total"], p.recompute_flops, p.recompute_flops),
    }
    for name, prog in compiled["programs"].items():
        peak, flops, model_flops = planner[name]
        seconds = flops / rate
        prog.update(
            planner_peak=peak,
            planner_over_compiled=peak / prog["peak"],
            hardware_flops=flops,
            predicted_s=seconds,
            predicted_mfu=model_flops / (p.devices * inp.peak_flops * seconds),
        )
    usable = p.usable_bytes
    fits = p.fits and (target == "cpu" or all(x["peak"] <= usable for x in compiled["programs"].values()))
    return dict(
        compiled,
        target=target,
        devices=p.devices,
        usable_bytes=usable,
        fits=fits,
        assumed_utilization=inp.mfu,
        peak_flops=inp.peak_flops,
    )


def render(report: dict[str, Any]) -> str:
    """The human table of a compile report."""
    where = (
        "a deviceless H200" if report["target"] == "h200" else "fake host CPU devices (bytes not an H200's)"
    )
    lines = [
        f"compiled for {where} x {report['devices']}, attention kernel: {report['kernel']}",
        f"  {'program':<11}{'conditionals':>13}{'compiled GB':>13}{'planner GB':>12}{'planner/compiled':>18}"
        f"{'predicted s':>13}{'MFU':>6}",
    ]
    for name, label in PROGRAMS.items():
        prog = report["programs"][name]
        lines.append(
            f"  {label:<11}{prog['conditionals']:>13}{prog['peak'] / 1e9:>13.2f}"
            f"{prog['planner_peak'] / 1e9:>12.2f}{prog['planner_over_compiled']:>18.2f}"
            f"{prog['predicted_s']:>13.3g}{prog['predicted_mfu']:>6.0%}"
        )
    lines.append(
        f"  predicted: the planner's FLOPs (recomputed layers counted) at an assumed "
        f"{report['assumed_utilization']:.0%} of {report['peak_flops'] / 1e12:.0f} TFLOP/s per device "
        "(mesh.mfu, mesh.peak_tflops); MFU counts model FLOPs only"
    )
    hlo = [report["programs"][name].get("hlo") for name in PROGRAMS]
    if all(hlo):
        lines.append(f"  optimized HLO: {', '.join(hlo)}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(_compile_child(json.loads(sys.argv[1]))))
