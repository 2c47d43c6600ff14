"""`jaxswe pipeline --config configs/demo-cpu.yaml` end to end, shrunk to 2 tasks, a few steps and
one RL iteration: every stage runs in order, hands its checkpoint on, and writes its artifacts."""

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DATA, ROOT

from jaxswe.cli import main
from jaxswe.config import load_config
from jaxswe.model import token_logprobs
from jaxswe.policy import load_policy
from jaxswe.stages.context import check_inputs
from jaxswe.stages.runtime import env_factory
from jaxswe.stages.warmstart import CORPUS_WORKDIR, corpus_texts

CONFIG = ROOT / "configs" / "demo-cpu.yaml"
SHRINK = (DATA / "demo_shrink.txt").read_text().split()  # also CI's prelude's


def _demo_run(tmp_path: Path, capsys) -> tuple[Path, str]:
    """(run dir, stderr) of the shrunk demo: the run CI's fresh-install prelude made (its dir in
    JAXSWE_DEMO_RUN, its stderr in DIR.log; the same command) so the demo runs once in CI, else
    a run made here."""
    if os.environ.get("JAXSWE_DEMO_RUN"):
        run_dir = Path(os.environ["JAXSWE_DEMO_RUN"])
        return run_dir, run_dir.with_suffix(".log").read_text()
    run_dir = tmp_path / "demo"
    argv = ["pipeline", "--config", str(CONFIG), "--run-dir", str(run_dir)]
    main([*argv, *(a for s in SHRINK for a in ("--set", s))])  # raises SystemExit on error
    return run_dir, capsys.readouterr().err


@pytest.mark.slow
def test_demo_pipeline_shrunk(tmp_path, capsys):
    run_dir, err = _demo_run(tmp_path, capsys)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["warmstart", "rft", "rl", "eval"]
    assert all(0.0 <= s["pass_at_1"] <= 1.0 for s in summary["stages"])
    assert all(np.isfinite(s["pass_at_1"]) for s in summary["stages"])
    # each training stage against the one before, paired over the same 2 tasks
    assert [(p["before"], p["after"], p["num_tasks"]) for p in summary["paired"]] == [
        ("warmstart", "rft", 2),
        ("rft", "rl", 2),
    ]
    # the after-stage evals share their sampling seeds, so "on these tasks" pairs episode by episode
    assert all(p["these_tasks"]["method"] == "paired" for p in summary["paired"])
    by_name = {s["name"]: s for s in summary["stages"]}
    assert summary["paired"][1]["diff"] == pytest.approx(
        by_name["rl"]["pass_at_1"] - by_name["rft"]["pass_at_1"]
    )
    # a banner as each stage starts, its pass@1 and interval as it ends
    for stage in ("warmstart", "rft", "rl", "eval"):
        assert f"jaxswe: == {stage} " in err and f"jaxswe: == {stage} done in " in err
    assert err.count("pass@1 ") >= 4 and "rl - rft pass@1: " in err
    # both demo tasks' tests accept a wrong fix (their records store it): the eval stage says so
    strength = json.loads((run_dir / "eval" / "summary.json").read_text())["task_strength"]
    assert strength["below_1"] == {"builtin__roman-1": 0.5, "builtin__stack-1": 0.5}, strength
    assert "test strength mean 0.50, 2 of 2 measured tasks below 1.0" in err
    for stage in ("warmstart", "rft", "rl", "eval"):
        d = run_dir / stage
        for name in ("config.yaml", "metrics.jsonl", "summary.json", "model.json"):
            assert (d / name).is_file(), (stage, name)
        assert list(d.glob("plots/*.png")) and list(d.glob("trajectories/*.jsonl"))
        assert list(d.rglob("events.out.tfevents.*"))
    for stage in ("warmstart", "rft", "rl"):
        assert any(p.name.isdigit() for p in (run_dir / stage / "checkpoints").iterdir())
    warmstart = json.loads((run_dir / "warmstart" / "summary.json").read_text())
    assert (warmstart["demonstrations"], warmstart["decoys"]) == (2, 2)  # the config's decoys, one a task
    decoys = [
        json.loads(line)
        for line in (run_dir / "warmstart/trajectories/decoys.jsonl").read_text().splitlines()
    ]
    assert [(d["ended_by"], d["patch"], d["reward"]) for d in decoys] == [("submitted", "", 0.0)] * 2
    # each stage trained and handed its weights on: RFT moved the warm start's weights iff it took
    # an SFT step; RL's weights are one iteration from RFT's (not from the warm start's)
    cfg = load_config(CONFIG, SHRINK)
    params = {s: jax.device_get(load_policy(run_dir / s, cfg).params) for s in ("warmstart", "rft", "rl")}
    rft, rl = (json.loads((run_dir / s / "summary.json").read_text()) for s in ("rft", "rl"))
    rl_row = json.loads((run_dir / "rl" / "metrics.jsonl").read_text().splitlines()[-1])
    assert all(np.isfinite(v) for v in rl_row.values() if isinstance(v, float))
    assert (_distance(params["warmstart"], params["rft"]) > 0) == (rft["sft_steps"] > 0)
    assert (_distance(params["rft"], params["rl"]) > 0) == (rl_row["optimizer_steps"] > 0)
    # RL sampled its first iteration with RFT's weights: they reproduce its rollout log-probs
    model_cfg = load_policy(run_dir / "rft", cfg).model_cfg
    episode = json.loads((run_dir / "rl" / "trajectories" / "iter_0001.jsonl").read_text().splitlines()[0])
    ids, mask = np.asarray([episode["input_ids"]]), np.asarray([episode["loss_mask"]]) > 0
    for stage, expect in (("rft", True), ("warmstart", rft["sft_steps"] == 0)):
        logp = np.asarray(token_logprobs(params[stage], model_cfg, jnp.asarray(ids)))
        gap = np.abs(logp[mask] - np.asarray([episode["rollout_logprobs"]])[mask]).max()
        assert (gap < 1e-3) == expect, (stage, gap)
    # as a person reads it: `jaxswe inspect` on the run (its RL stage on built-in tasks) in chromium
    from browser_helpers import assert_screenshot_not_blank, dump_dom, rendered_episodes

    report = tmp_path / "report.html"
    main(["inspect", str(run_dir), "--out", str(report)])
    dom = dump_dom(report, "")
    assert 'data-ready="1"' in dom and all(f"<h2>{s} " in dom for s in ("warmstart", "rft", "rl", "eval"))
    rl_episodes = (run_dir / "rl" / "trajectories" / "iter_0001.jsonl").read_text().splitlines()
    assert "iter_0001.jsonl" in dom and len(rendered_episodes(dom)) >= len(rl_episodes)
    assert sum('<div class="turn">' in e for e in rendered_episodes(dom)) >= len(rl_episodes)  # turn by turn
    assert_screenshot_not_blank(report, tmp_path / "report.png")


def _distance(a, b) -> float:
    """Largest absolute difference between two param pytrees."""
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(
        jax.tree.leaves(a), jax.tree.leaves(b), strict=True))  # fmt: skip


def test_demo_tokenizer_corpus_is_reproducible():
    """The demo tokenizer's corpus holds no random sandbox name: same tasks, same tokenizer."""
    cfg = load_config(CONFIG, ["task_subset=[builtin__stack-1]"])
    tasks = check_inputs(cfg).tasks
    make_env = env_factory(cfg, tasks)
    first, second = corpus_texts(cfg, tasks, make_env), corpus_texts(cfg, tasks, make_env)
    assert first == second
    windows = [t for t in first if "[File: " in t]  # the edit's file window names the file, relative
    assert windows and not any(f"[File: {CORPUS_WORKDIR}" in t or "[File: /" in t for t in windows), windows
    assert len(first[0]) < 200  # the demo's short system prompt, not the default manual
