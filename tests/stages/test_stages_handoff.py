"""RFT -> RL stage 1 -> RL stage 2 through Orbax checkpoints, on the toy env (same stage code as
`jaxswe rft` / `jaxswe rl`), with stage 2's task filter applied from stage 1's saved history."""

import json
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rl_toy_helpers import toy_config, toy_context, toy_policy

from jaxswe.agent.trajectory import load_jsonl
from jaxswe.model import token_logprobs
from jaxswe.policy import load_policy
from jaxswe.rl.problems import filter_by_history, load_history
from jaxswe.run.metrics import read_rows
from jaxswe.stages.finish import finish_stage
from jaxswe.stages.rft import run_rft
from jaxswe.stages.rl import run_rl

NV = 2


def _same(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


@pytest.mark.slow
def test_rft_rl_stage2_handoff(tmp_path):
    fp32 = {"dtype": "float32", "remat": "none"}  # stages compute like the toy policy, in float32
    # one device: 8 fake CPU devices run collectives, and two in flight at once on XLA:CPU's shared
    # thread pool can deadlock under load (the sharded steps have tests of their own)
    one = {"devices": 1}
    cfg = toy_config(model=fp32, mesh=one, rft={"samples_per_task": 4}, rl={"iterations": 1})
    policy, tok = toy_policy(tmp_path, NV)

    # RFT from the random policy: sample, keep resolved, SFT, checkpoint.
    rft_summary, rft_params = run_rft(toy_context(cfg, tmp_path / "rft", policy, tok, NV), resume=False)
    samples = load_jsonl(tmp_path / "rft" / "trajectories" / "samples.jsonl")
    assert len(samples) == 8 * 4
    assert rft_summary["tasks_with_success"] == len({e.task_id for e in samples if e.resolved})
    assert rft_summary["trajectories_kept"] == sum(e.resolved for e in samples)

    # RL stage 1 starts from the RFT checkpoint.
    p1 = load_policy(tmp_path / "rft", cfg)
    assert _same(p1.params, rft_params)
    ctx1 = toy_context(cfg, tmp_path / "rl1", p1, tok, NV, seed=1)
    s1 = finish_stage(ctx1, *run_rl(ctx1, resume=False))
    assert s1["iterations"] == 1
    history = load_history(tmp_path / "rl1")
    assert sum(len(v) for v in history.values()) == len(
        read_rows(tmp_path / "rl1" / "metrics.jsonl")
    ) * 64 - sum(r["infra_failures"] for r in read_rows(tmp_path / "rl1" / "metrics.jsonl"))

    # RL stage 2: own config, stage-1 checkpoint, filtered pool from stage 1's history.
    cfg2 = toy_config(
        model=fp32,
        mesh=one,
        rl={"iterations": 1, "task_filter": "solved_fraction", "drop_never_solved": False},
    )
    p2 = load_policy(tmp_path / "rl1", cfg2)
    # stage 1 sampled with the RFT weights it was handed (they reproduce its rollout log-probs)
    # and handed on the weights it trained to (64 episodes of a 2-value guessing game: groups train)
    row1 = read_rows(tmp_path / "rl1" / "metrics.jsonl")[-1]
    assert row1["groups_kept"] > 0 and row1["optimizer_steps"] > 0 and row1["trajectories_trained"] > 0
    assert not _same(p2.params, p1.params)
    assert all(np.isfinite(v) for v in row1.values() if isinstance(v, float))
    ep = load_jsonl(tmp_path / "rl1" / "trajectories" / "iter_0001.jsonl")[0]
    logp = np.asarray(token_logprobs(p1.params, p1.model_cfg, jnp.asarray([ep.input_ids])))[0]
    mask = np.asarray(ep.loss_mask) > 0
    np.testing.assert_allclose(logp[mask], np.asarray(ep.rollout_logprobs)[mask], atol=1e-4)
    ctx2 = replace(toy_context(cfg2, tmp_path / "rl2", p2, tok, NV, seed=2), init_from=str(tmp_path / "rl1"))
    expected, counts = filter_by_history(ctx2.task_ids, history, drop_never_solved=False)
    s2 = finish_stage(ctx2, *run_rl(ctx2, resume=False))
    saved = json.loads((tmp_path / "rl2" / "task_filter.json").read_text())
    assert saved["pool"] == expected and s2["task_filter"] == counts
    trained_on = {e.task_id for e in load_jsonl(tmp_path / "rl2" / "trajectories" / "iter_0001.jsonl")}
    assert trained_on <= set(expected)
    for d in ("rft", "rl1", "rl2"):
        assert (tmp_path / d / "config.yaml").is_file() and (tmp_path / d / "model.json").is_file()
