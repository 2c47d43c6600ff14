"""bench/gpu/check.py --cpu-dry-run: every section of the H200 check runs, at tiny shapes, in the
device image's conditions (no pydantic, no typer: they are blocked here), and fills one table.
About 50 s of CPU (six processes, each compiling at tiny shapes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_cpu_dry_run(tmp_path):
    blocked = tmp_path / "blocked"
    for name in ("pydantic", "typer"):  # absent from the GPU image: the check must not need them
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is not on the GPU image')\n")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, like one GPU
    env["PYTHONPATH"] = os.pathsep.join([str(blocked), str(ROOT)])
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu" / "check.py"), "--cpu-dry-run", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    log = (out / "check.log").read_text() if (out / "check.log").is_file() else proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["check.json", "check.log", "check.md"]
    result = json.loads((out / "check.json").read_text())
    assert set(result["status"]) == {"env", "peaks", "attention", "train_8k", "train_32k", "decode", "tiles"}
    assert all(s == "ok" for s in result["status"].values()), result["status"]
    assert result["environment"]["dry_run"] and result["environment"]["backend"] == "cpu"
    rows = {r["name"]: r for r in result["rows"]}
    measured = [
        "bf16 matmul 256^3",
        "attention fwd+bwd T=320 blockwise",
        "attention fwd+bwd T=320 pallas",
        "train step T=512 tokens/s",
        "train step T=128 MFU vs measured peak",
        "sampler decode batch 4",
    ]
    for name in measured:
        assert rows[name]["value"] > 0, rows[name]
    err = rows["attention T=320 fused vs blockwise: max rel error (out, dq, dk, dv)"]["value"]
    assert err < 0.05  # bf16 inputs, float32 accumulation in both kernels
    assert rows["train step T=128 peak memory vs planner"]["planned_gb"] > 0
    assert rows["train step T=512 step time vs predicted"]["predicted_s"] > 0  # jaxswe plan --compile's
    table = (out / "check.md").read_text()
    assert table.count("\n| ") == len(result["rows"]) + 2 and "CPU DRY RUN" in table
