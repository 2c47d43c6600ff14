"""Memory planner and `jaxswe plan`: exact param bytes, real-scale configs, the CLI. The planner
against the compiled real step: tests/cli/test_planner_compiler.py."""

import json
from pathlib import Path

import pytest
from helpers import ROOT

from jaxswe.cli import main
from jaxswe.config import load_config
from jaxswe.plan import plan_config
from sharding import ShardingError
from sharding.planner import ModelShape, PlanInput, plan

CONFIGS = sorted(ROOT.glob("configs/qwen2.5-*/*.yaml"))
QWEN72 = ModelShape(
    vocab=152064, hidden=8192, intermediate=29568, layers=80, heads=64, kv_heads=8, head_dim=128, tie=False
)


def test_qwen72b_param_count_and_stage2_fits():
    p = plan(
        PlanInput(
            QWEN72, {"data": 1, "fsdp": 16, "context": 8, "tensor": 1}, seq_len=131072, rows=256, num_micro=16
        )
    )
    assert round(p.params_total / 1e9, 1) == 72.7
    assert p.fits and p.per_device_bytes["total"] < 0.9 * 141e9
    assert p.per_device_bytes["params"] == pytest.approx(72.7e9 * 4 / 128, rel=0.01)
    assert p.tokens_per_device == 16384


def test_plan_says_what_to_change_when_it_does_not_fit():
    p = plan(PlanInput(QWEN72, {"data": 1, "fsdp": 16, "context": 1, "tensor": 1}, seq_len=131072, rows=16))
    assert not p.fits and p.biggest == "activations" and "context" in p.advice
    # on one host of 8 the float32 masters, gradients and AdamW state alone (145 GB a GPU) do not
    # fit: no batch setting helps, so the advice is the least device count
    p = plan(PlanInput(QWEN72, {"data": 1, "fsdp": 8, "context": 1, "tensor": 1}, seq_len=131072, rows=8))
    assert not p.fits and "need 145 of 127 GB a device: at least 10 devices (2 hosts of 8" in p.advice
    with pytest.raises(ShardingError, match="micro-batches"):
        plan(PlanInput(QWEN72, {"fsdp": 16}, seq_len=1024, rows=24, num_micro=1))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_scale_configs_validate_and_fit(path):
    cfg = load_config(path)
    p, inp, _ = plan_config(cfg)
    assert p.fits, f"{path}: {p.per_device_bytes} - {p.advice}"
    hosts = 16 if "72b" in str(path) else 1
    assert p.devices == 8 * hosts == cfg.mesh.num_hosts * cfg.mesh.devices_per_host
    stage = "rl" if "rl" in cfg.stages else "rft"
    assert inp.seq_len == {"rft": 65536, "rl-stage1": 65536, "rl-stage2": 131072}[path.stem]
    if stage == "rl":
        assert cfg.rollout.temperature == 1.0 and cfg.rollout.top_k == -1 and cfg.rollout.top_p == 1.0
    if path.stem == "rl-stage2":
        assert cfg.model.rope_scaling["factor"] == 4.0 and (cfg.rl.eps_low, cfg.rl.eps_high) == (0.2, 0.26)


def test_plan_cli_json_and_errors(capsys, tmp_path):
    main(["plan", "--config", "configs/qwen2.5-72b/rl-stage2.yaml", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is True and round(out["params_total"] / 1e9, 1) == 72.7
    assert set(out["per_device_bytes"]) >= {
        "params",
        "grads",
        "optimizer",
        "activations",
        "transient",
        "total",
    }
    assert out["device_memory_bytes"] == 141 * 10**9
    assert 0 < out["recompute_bytes"]["total"] < out["per_device_bytes"]["total"]
    # Too little memory: exit 1 and the table names the problem.
    with pytest.raises(SystemExit) as ex:
        main(["plan", "--config", "configs/qwen2.5-72b/rl-stage2.yaml", "--set", "mesh.gpu_memory_gb=20"])
    assert ex.value.code == 1 and "fits: NO" in capsys.readouterr().out
    with pytest.raises(SystemExit) as ex:
        main(
            [
                "plan",
                "--config",
                "configs/qwen2.5-72b/rl-stage2.yaml",
                "--set",
                "mesh.axes.fsdp=-1",
                "--set",
                "mesh.axes.context=3",
            ]
        )
    assert ex.value.code == 2 and "does not divide" in capsys.readouterr().err
    bad = tmp_path / "c.yaml"
    bad.write_text("model: {path: /nowhere/mystery-model}\n")
    with pytest.raises(SystemExit) as ex:
        main(["plan", "--config", str(bad)])
    assert ex.value.code == 2 and "no config.json" in capsys.readouterr().err


@pytest.mark.slow
def test_plan_compile_on_host_cpu_writes_hlo_and_counts_branches(capsys, tmp_path, monkeypatch):
    """`--compile --target cpu`: the child process and code path of the deviceless H200 compile, on
    8 fake CPU devices (toy-rl, dense attention: no branch in its loops); ~10 s."""
    import jax

    from jaxswe.plan.compile_report import render
    from jaxswe.plan.compiled_memory import conditionals

    args = ["plan", "--config", "configs/toy-rl.yaml", "--set", "model.attention=dense", "--compile"]
    main([*args, "--target", "cpu", "--hlo-dir", str(tmp_path / "hlo"), "--json"])
    out = json.loads(capsys.readouterr().out)
    rep = out["compiled"]
    assert (rep["target"], rep["devices"], rep["kernel"], rep["fits"]) == ("cpu", 8, "dense", True)
    step, rec = rep["programs"]["step"], rep["programs"]["recompute"]
    for prog in (step, rec):
        text = Path(prog["hlo"]).read_text()
        assert text.startswith("HloModule") and prog["conditionals"] == conditionals(text) == 0
        assert prog["peak"] == prog["arguments"] + prog["temporaries"] + prog["outputs"] - prog["aliased"] > 0
        assert prog["planner_over_compiled"] == pytest.approx(prog["planner_peak"] / prog["peak"])
        assert prog["predicted_s"] == pytest.approx(prog["hardware_flops"] / (8 * 989e12 * 0.4))
    lines = render(rep).splitlines()
    assert lines[0] == "compiled for fake host CPU devices (bytes not an H200's) x 8, attention kernel: dense"
    assert lines[2].split()[:3] == ["train", "step", "0"] and lines[3].split()[:2] == ["recompute", "0"]
    assert lines[-1] == f"  optimized HLO: {step['hlo']}, {rec['hlo']}"
    assert step["planner_peak"] == out["per_device_bytes"]["total"]
    assert rec["planner_peak"] == out["recompute_bytes"]["total"]
    # remat none: the step is forward + backward (3x the recompute pass's forward), MFU as assumed
    assert step["hardware_flops"] == pytest.approx(3 * rec["hardware_flops"]) and step["predicted_mfu"] == 0.4
    # the counter sees a data-dependent branch in an optimized program
    branchy = jax.jit(lambda x: jax.lax.cond(x.sum() > 0, jax.numpy.sin, lambda y: y, x))
    assert conditionals(branchy.lower(jax.numpy.ones(4)).compile().as_text()) == 1
    # an H200 compile without the plugin: one line saying how to get it, exit 2
    monkeypatch.delenv("JAXSWE_CUDA_PLUGIN", raising=False)
    with pytest.raises(SystemExit) as ex:
        main(args)
    err = capsys.readouterr().err
    assert ex.value.code == 2 and "pip install --no-deps --target" in err
    assert len(err.strip().splitlines()) == 1
