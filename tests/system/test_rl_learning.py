"""RL alone learns a multi-turn skill from a random init: `jaxswe rl --config configs/toy-rl.yaml`
(the smoke test users run; embedded engine, sharded DAPO step, a small `rl.entropy_coef`) on the
toy find-the-key env. With `require_look` a blind guess can neither win nor end the episode;
with `show_answer` the `look` observation spells out the winning action; every episode draws its
own key. A random policy
almost never wins (a timeout also costs the turn penalty, -1). Looking and then guessing wins 1/2
with 2 values, so the >= 80% this test asks for means the policy reads the observation of an
earlier turn and copies it.

Measured (lr 2e-3, 8 x 8 episodes an iteration with up to 3 resampling rounds, 30 iterations;
docs/performance.md): the config's seed 2 passes 0.8 at iteration 18 and stays at 0.98-1.0; over
seeds 1-12, 11 reach 0.8 (at lr 3e-3, 10; runs collapsed after partial learning). Before the bonus,
seed 0 stalled near 0.5: before the policy reads the observation every `submit N` after a look is
equally good, softmax policy gradient commits to one of them, and a near-deterministic wrong answer
gets almost no gradient; the bonus (entropy_coef 0.02) keeps the choice open until copying is
learned. With 4 values, success stayed between 0.25 and 0.84 over the seeds and coefficients tried.
Runs repeat exactly on one machine; another CPU's float rounding can move a seed's curve after a few
iterations.
The test runs the config's first 21 iterations (the config's seed holds 0.9-1.0 from iteration 18,
so its last 3 are held ones): the iterations after learning resample their all-solved groups and
cost the most.
`JAXSWE_LEARNING_SET` (space-separated key=value overrides, e.g. "seed=1 rl.entropy_coef=0") changes
the settings for tuning runs by hand."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, user_env

from jaxswe.run.metrics import read_rows

CONFIG = ROOT / "configs" / "toy-rl.yaml"
OVERRIDES = os.environ.get("JAXSWE_LEARNING_SET", "").split()
ITERATIONS = 21


def learned(rates: list[float]) -> bool:
    """Reached 0.8 and held it over the last 3 iterations: 64 episodes at 0.8 sit more than 4
    standard errors above the 0.5 of looking, then guessing."""
    return max(rates) >= 0.8 and sum(rates[-3:]) / 3 >= 0.8


def run_toy_rl(run_dir: Path, *sets: str) -> list[dict]:
    """`jaxswe rl --config configs/toy-rl.yaml` as a user runs it: its own process, one CPU device
    (not the suite's 8 fake devices, whose collectives can hit XLA's rendezvous timeout on a
    loaded 2-core machine)."""
    env = user_env()
    argv = [sys.executable, "-m", "jaxswe", "rl", "--config", str(CONFIG), "--run-dir", str(run_dir)]
    argv += [a for o in ("logging.backends=[]", *sets) for a in ("--set", o)]  # TensorBoard: test_metrics.py
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1500, cwd=CONFIG.parents[1])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "jaxswe: == rl done in " in out.stderr
    return read_rows(run_dir / "rl" / "metrics.jsonl")


@pytest.mark.slow
def test_toy_rl_config_learns_from_random_init(tmp_path):
    """The config's seed learns; where another machine's float rounding moved its curve (runs
    repeat exactly on one machine; 10 of seeds 1-12 learn and hold here), seed 3 (0.8 at 18) must."""
    rows = run_toy_rl(tmp_path / "rl", f"rl.iterations={ITERATIONS}", *OVERRIDES)
    rates = [r["pass_rate"] for r in rows]
    returns = [r["reward_mean"] for r in rows]
    print("pass rates", rates)
    # 8 groups of 8 a round, up to 3 more rounds for the groups left uninformative
    assert len(rows) == ITERATIONS and all(
        r["infra_failures"] == 0 and 64 <= r["episodes"] <= 4 * 64 for r in rows
    )
    assert all(r["episodes"] % 8 == 0 for r in rows) and any(r["resample_rounds"] for r in rows)
    assert rates[0] <= 0.2 and returns[0] <= -0.8, (rates, returns)
    if not learned(rates):
        rows = run_toy_rl(tmp_path / "seed3", f"rl.iterations={ITERATIONS}", *OVERRIDES, "seed=3")
        rates = [r["pass_rate"] for r in rows]
        print("seed 3 pass rates", rates)
    assert learned(rates), rates
