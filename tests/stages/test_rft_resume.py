"""RFT as the paper runs it, and resumable at every point (the toy env through the same stage code
as `jaxswe rft`): samples stream to disk as episodes finish and a killed collection runs only the
missing slots; SFT checkpoints every N steps and a crashed SFT resumes to the very weights an
uninterrupted run reaches; the step count is epochs x kept / batch."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import jax
import numpy as np
import pytest
from rl_toy_helpers import toy_config, toy_context, toy_policy

from jaxswe.errors import UserError
from jaxswe.run.metrics import read_rows
from jaxswe.stages.rft import collect_samples, run_rft
from jaxswe.train.trainer import Trainer

NV = 2


def _close(ctx):
    ctx.backend.close()


@pytest.mark.slow
def test_killed_collection_resumes_where_it_stopped(tmp_path):
    cfg = toy_config(rft={"samples_per_task": 2})
    policy, tok = toy_policy(tmp_path, NV)
    ctx = toy_context(cfg, tmp_path / "rft", policy, tok, NV, num_tasks=4)
    path = tmp_path / "rft" / "trajectories" / "samples.jsonl"
    first = collect_samples(ctx, path)
    slots = [t for t in ctx.task_ids for _ in range(2)]
    assert [e.task_id for e in first] == slots
    lines = path.read_text().splitlines()
    assert len(lines) == 8  # streamed: one line per finished episode
    # killed while writing the 4th line: three complete rows and a torn one
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:25])
    kept = {json.loads(line)["stage"]["slot"]: json.loads(line) for line in lines[:3]}
    built = []
    make_env = ctx.make_env
    ctx = replace(ctx, make_env=lambda task, seed=None: built.append(task) or make_env(task, seed))
    second = collect_samples(ctx, path)
    _close(ctx)
    assert len(built) == 5 and [e.task_id for e in second] == slots
    for slot, row in kept.items():  # what was on disk is not sampled again
        assert second[slot].input_ids == row["input_ids"]
    assert sorted(json.loads(line)["stage"]["slot"] for line in path.read_text().splitlines()) == list(
        range(8)
    )

    changed = toy_config(rft={"samples_per_task": 3})
    ctx3 = toy_context(changed, tmp_path / "rft", policy, tok, NV, num_tasks=4)
    with pytest.raises(UserError, match="not of this run's tasks"):
        collect_samples(ctx3, path)


@pytest.mark.slow
def test_sft_crash_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch):
    cfg = toy_config(
        rft={"samples_per_task": 4},
        sft={"batch_size": 1, "max_steps": None, "epochs": 1.0, "checkpoint_every": 2, "seq_len": 128},
        optimizer={"lr": 1e-3, "schedule": "cosine", "total_steps": 1000, "warmup_steps": 1},
    )
    policy, tok = toy_policy(tmp_path, NV, single_token_actions=True)  # random actions well-formed
    ctx_a = toy_context(cfg, tmp_path / "a", policy, tok, NV)
    summary_a, params_a = run_rft(ctx_a, resume=False)
    _close(ctx_a)
    kept = summary_a["trajectories_kept"]
    assert kept >= 3 and summary_a["sft_steps"] == kept  # 1 epoch at batch 1
    lr = [r["lr"] for r in read_rows(tmp_path / "a" / "metrics.jsonl")]
    assert lr[-1] < 0.5 * max(lr)  # the cosine decays over the steps RFT runs, not total_steps 1000

    # the same samples, an SFT that dies at step 3 (after the checkpoint at step 2)
    ctx_b = toy_context(cfg, tmp_path / "b", policy, tok, NV)
    (tmp_path / "b" / "trajectories").mkdir()
    shutil.copy(tmp_path / "a" / "trajectories" / "samples.jsonl", tmp_path / "b" / "trajectories")
    real = Trainer.sft_update
    calls = []

    def dies_at_step_3(self, batch):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return real(self, batch)

    monkeypatch.setattr(Trainer, "sft_update", dies_at_step_3)
    with pytest.raises(RuntimeError, match="killed"):
        run_rft(ctx_b, resume=True)
    monkeypatch.setattr(Trainer, "sft_update", real)
    assert (tmp_path / "b" / "checkpoints" / "2").is_dir()
    ctx_b = toy_context(cfg, tmp_path / "b", policy, tok, NV)  # the restarted process's
    summary_b, params_b = run_rft(ctx_b, resume=True)
    _close(ctx_b)
    assert summary_b["sft_steps"] == kept
    for a, b in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)
    assert [r["step"] for r in read_rows(tmp_path / "b" / "metrics.jsonl")] == list(range(1, kept + 1))
