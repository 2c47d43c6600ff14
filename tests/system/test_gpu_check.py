"""bench/gpu/check.py --cpu-dry-run: every section of the H200 check runs, at tiny shapes, in the
device image's conditions (no pydantic, no typer: they are blocked here), and fills one table.
About 55 s of CPU (seven processes: env and six sections, each compiling at tiny shapes). The RL
settings the check writes out are held equal to the shipped RL configs'."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, user_env

CHECK = ROOT / "bench" / "gpu" / "check.py"


def _check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports no JAX at module level
    return module


@pytest.mark.parametrize("preset", ["qwen2.5-7b", "qwen2.5-72b"])
def test_gpu_check_rl_settings_are_the_shipped_configs(preset):
    from jaxswe.config import load_config
    from jaxswe.losses import LossSettings
    from jaxswe.model.config import YarnScaling
    from jaxswe.policy import model_knobs

    check = _check_module()
    cfg = load_config(ROOT / "configs" / preset / "rl-stage1.yaml")
    s = check.RL_SETTINGS
    model = {k: v for k, v in s["model"].items() if k not in ("max_context", "rope_scaling")}
    assert model_knobs(cfg) == model
    assert cfg.model.max_context == s["model"]["max_context"]
    yarn = lambda rope: YarnScaling.from_hf(rope, cfg.model.max_context)
    assert yarn(cfg.model.rope_scaling) == yarn(s["model"]["rope_scaling"])
    opt = cfg.optimizer.model_dump()
    assert {k: opt[k] for k in s["optimizer"]} == s["optimizer"]
    assert set(opt) == set(s["optimizer"]) | {"micro_batches"}  # a new optimizer key: add it there
    assert opt["micro_batches"] == check.RL_MICRO_BATCHES[preset]
    assert LossSettings.from_rl(cfg.rl) == LossSettings(**s["loss"])
    mesh = cfg.mesh
    assert list(mesh.axes) == s["mesh"]["axes"] and mesh.rules == s["mesh"]["rules"]
    for key in ("context_attention", "gpu_memory_gb", "memory_headroom", "peak_tflops", "mfu"):
        assert getattr(mesh, key) == s["mesh"][key], key


@pytest.mark.slow
def test_gpu_check_cpu_dry_run(tmp_path):
    blocked = tmp_path / "blocked"
    for name in ("pydantic", "typer"):  # absent from the GPU image: the check must not need them
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is not on the GPU image')\n")
    env = user_env()
    env["PYTHONPATH"] = os.pathsep.join([str(blocked), str(ROOT)])
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(CHECK), "--cpu-dry-run", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    log = (out / "check.log").read_text() if (out / "check.log").is_file() else proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["check.json", "check.log", "check.md"]
    result = json.loads((out / "check.json").read_text())
    assert set(result["status"]) == {"env", "peaks", "attention", "rl_7b", "rl_72b", "decode", "tiles"}
    assert all(s == "ok" for s in result["status"].values()), result["status"]
    assert result["environment"]["dry_run"] and result["environment"]["backend"] == "cpu"
    names = [r["name"] for r in result["rows"]]
    rows = {r["name"]: r for r in result["rows"]}
    errors = [
        f"attention T=320 {h} heads fused vs blockwise: max rel error (out, dq, dk, dv)"
        for h in ("7/1", "8/1")
    ]
    assert [n for n in names if n.startswith("attention")][:2] == errors  # before any kernel's time
    for name in errors:
        assert rows[name]["value"] < 0.05  # bf16 inputs, float32 accumulation in both kernels
    rl_7b = "RL 7B (hidden 64, 7/1 heads) x 2 layers, T=512: "
    rl_72b = "RL 72B (hidden 64, 8/1 heads) x 1 layer, T=256: "
    measured = [
        "bf16 matmul 256^3",
        "attention fwd+bwd T=320 7/1 heads blockwise",
        "attention fwd+bwd T=320 7/1 heads pallas",
        "attention fwd+bwd T=320 8/1 heads pallas",
        rl_7b + "recompute time vs predicted",
        rl_7b + "DAPO update time vs predicted",
        rl_7b + "DAPO update MFU vs measured peak",
        rl_72b + "DAPO update time vs predicted",
        rl_72b + "DAPO update MFU vs measured peak",
        "sampler decode batch 4",
    ]
    for name in measured:
        assert rows[name]["value"] > 0, rows[name]
    for name in (rl_7b + "recompute time vs predicted", rl_7b + "DAPO update time vs predicted"):
        assert rows[name]["predicted_s"] > 0  # jaxswe plan --compile's
    assert rows[rl_72b + "DAPO update time vs predicted"]["predicted_s"] > 0
    for name in (rl_7b + "recompute", rl_7b + "DAPO update", rl_72b + "DAPO update"):
        row = rows[name + " peak memory vs planner"]
        assert row["planned_gb"] > 0 and row["compiler_gb"] > 0, row
    table = (out / "check.md").read_text()
    assert table.count("\n| ") == len(result["rows"]) + 2 and "CPU DRY RUN" in table
