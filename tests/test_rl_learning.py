"""RL alone learns a multi-turn skill from a random init: the RL loop of `jaxswe rl` (run_rl,
embedded engine, sharded DAPO step) on the toy find-the-key env. With `require_look` a blind
guess can neither win nor end the episode; with `show_answer` the `look` observation spells out
the winning action. A random policy almost never wins; the learned one looks, then submits what
it saw, winning more often than the 1/NV of looking and then guessing: it reads the observation
of an earlier turn.

Known gap (issue 7 asks for >= 80%): success plateaus near 50-60%. Before the policy reads the
observation, every `submit N` after a look is equally good, and softmax policy gradient commits
to one of equally good actions (the update widens whichever gap noise opened), so the choice of
N collapses before copying is learned; the trainer learns the copy from the same ±1 advantages in
40-60 steps when actions are uniform. `JAXSWE_LEARNING_TUNE` (JSON: seed, p, g, lr, iters, tps)
overrides the settings for tuning runs by hand."""

import json
import os

import pytest
from rl_toy_helpers import toy_config, toy_group_env_factory, toy_policy

from jaxswe.rollout.engine import EmbeddedEngine
from jaxswe.rollout.sampler import Sampler
from jaxswe.run.metrics import read_rows
from jaxswe.stages.rl import RLSetup, run_rl
from jaxswe.stages.rollouts import EmbeddedBackend
from jaxswe.stages.trainer import Trainer

NV = 4
MAX_ITERATIONS = 40
WIDE = {"hidden_size": 128, "intermediate_size": 256, "num_heads": 8, "num_kv_heads": 4}
TUNE = json.loads(os.environ.get("JAXSWE_LEARNING_TUNE", "{}"))


@pytest.mark.slow
def test_rl_learns_toy_env_from_random_init(tmp_path):
    seed, p, g = TUNE.get("seed", 0), TUNE.get("p", 8), TUNE.get("g", 8)
    cfg = toy_config(
        seed=seed,
        optimizer={"lr": TUNE.get("lr", 3e-3), "weight_decay": 0.0},
        rollout={"max_new_tokens": 1, "max_batch": p * g},
        agent={"max_turns": 4, "max_context_tokens": 128},
        rl={
            "iterations": TUNE.get("iters", MAX_ITERATIONS),
            "problems_per_iteration": p,
            "group_size": g,
            "trajectories_per_step": TUNE.get("tps", p * g // 4),
            "turn_penalty_threshold": 3,
            "rows_per_step": 16,
        },
    )
    policy, tok = toy_policy(tmp_path, NV, seed=seed, single_token_actions=True, **WIDE)
    # One compiled decode shape: every batch padded to p*g rows and 128 prompt tokens.
    sampler = Sampler(
        policy.model_cfg, policy.params, max_context=128, min_batch_bucket=p * g, min_prompt_bucket=128
    )
    setup = RLSetup(
        cfg=cfg,
        stage_dir=tmp_path / "rl",
        trainer=Trainer(policy.model_cfg, policy.params, cfg.optimizer, eps_low=0.2, eps_high=0.28),
        backend=EmbeddedBackend(EmbeddedEngine(sampler, max_batch=p * g), policy.model_cfg),
        tokenizer=tok,
        # every episode draws its own key: a policy that ignores the observation wins 1/NV
        make_env=toy_group_env_factory(seed, NV, g, require_look=True, shared_key=False, show_answer=True),
        pool=[f"toy-{i}" for i in range(16)],
    )
    run_rl(setup, resume=False)
    rows = read_rows(tmp_path / "rl" / "metrics.jsonl")
    rates = [r["pass_rate"] for r in rows]
    returns = [r["reward_mean"] for r in rows]
    print("pass rates", rates)
    assert len(rows) == cfg.rl.iterations and all(r["infra_failures"] == 0 for r in rows)
    best2 = lambda xs: max(sum(xs[i : i + 2]) / 2 for i in range(len(xs) - 1))  # noqa: E731
    assert rates[0] <= 0.2 and returns[0] <= -0.8, (rates, returns)
    # 128 episodes at 0.4 sit > 3 standard errors above 1/NV = 0.25 (looking, then guessing)
    assert best2(rates) >= 0.4, rates
    assert best2(returns) >= 0.3, returns
