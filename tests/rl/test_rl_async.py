"""Async RL (rl.max_staleness) and the one RL loop: k = 0 is the synchronous loop of the code before
the restructuring (its stored metrics rows), a weight update in the middle of an episode stamps
each token with the policy version that sampled it and weights it by its truncated importance
ratio, stale groups are not trained, and `jaxswe rl ... --set rl.max_staleness=1` learns."""

import asyncio
import json
import shlex
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DATA, ROOT, user_env
from rl_toy_helpers import toy_policy

from envs.toy import ToyEnv
from jaxswe.run.metrics import read_rows

CONFIG = ROOT / "configs" / "toy-rl.yaml"
REFERENCE = json.loads((DATA / "rl_sync_reference.json").read_text())


def _episode(task: str, versions: list[int], resolved: bool, logprobs: list[float] | None = None):
    """A one-turn episode whose sampled tokens are those with a policy version."""
    from jaxswe.agent.trajectory import Trajectory, Turn

    n = len(versions)
    return Trajectory(
        task_id=task,
        input_ids=list(range(n)),
        loss_mask=[int(v >= 0) for v in versions],
        rollout_logprobs=logprobs or [0.0] * n,
        policy_versions=versions,
        turns=[Turn(0, n)],
        ended_by="submitted",
        reward=float(resolved),
    )


def _timing(key: str) -> bool:
    return key.startswith("time_") or key.endswith("_per_s")


@pytest.mark.slow
def test_k0_reproduces_the_synchronous_loop_rows_through_ctrl_c_and_resume(tmp_path):
    """3 iterations at max_staleness 0 through the pump give the rows the separate synchronous
    collector wrote before it was deleted (same seed, one CPU device, dynamic sampling's resample
    rounds; tests/data/rl_sync_reference.json says how they were made, also without resampling:
    its first round is this run's). The run is stopped with Ctrl-C (SIGINT) after iteration 1,
    while iteration 2's episodes are in flight: it exits 130 within seconds with the curves and a
    partial summary so far (summary_partial.json: summary.json means finished) and, after the
    progress lines, only one line, holding the exact --resume command; that command finishes the
    run with the same rows."""
    # the reference's settings (the config then had seed 1 and lr 3e-3)
    sets = ("seed=1", "optimizer.lr=3e-3", "rl.iterations=3", "rl.max_staleness=0")
    sets += ("rl.resample_to_fill=true", "rl.max_resample_rounds=2")
    sets += ("logging.backends=[]",)  # no TensorBoard: its torch import is most of a process start
    run_dir = tmp_path / "run"
    stage = run_dir / "rl"  # RUN_DIR/<stage>
    env = user_env()
    argv = ["rl", "--config", str(CONFIG), "--run-dir", str(run_dir)]
    argv += [a for s in sets for a in ("--set", s)]
    log = tmp_path / "stderr.txt"  # a file: no pipe fills while the test waits
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jaxswe", *argv], env=env, cwd=ROOT, stderr=out)
    while len(read_rows(stage / "metrics.jsonl")) < 1:
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # iteration 2's episodes run
    t0 = time.monotonic()
    proc.wait(timeout=60)
    seconds = time.monotonic() - t0
    err = log.read_text()
    assert proc.returncode == 130 and seconds < 20, (seconds, err[-3000:])
    # after the progress lines only the line that resumes it: no traceback, no environment left
    # unclosed (the agent loop warns for each)
    header, hint = [line for line in err.splitlines() if not line.startswith("jaxswe rl ")]
    assert header == f"jaxswe: == rl -> {stage}", err
    assert hint.startswith("jaxswe: interrupted; continue with: "), err
    again = shlex.split(hint.split("continue with: ", 1)[1])
    assert again == ["jaxswe", *argv, "--resume"], hint
    assert (stage / "plots" / "rl_curves.png").is_file() and not (stage / "summary.json").exists()
    rows = read_rows(stage / "metrics.jsonl")
    partial = json.loads((stage / "summary_partial.json").read_text())
    assert partial["interrupted"] and partial["name"] == "rl", partial
    assert partial["steps_done"] == rows[-1]["step"] == len(rows) < 3 and partial["last_metrics"] == rows[-1]
    done = subprocess.run([sys.executable, "-m", *again], env=env, cwd=ROOT, capture_output=True, text=True)
    resumed = f"resuming RL from iteration {partial['resume_from_checkpoint']} "
    assert done.returncode == 0 and resumed in done.stderr, done.stderr[-3000:]
    assert (stage / "summary.json").is_file() and not (stage / "summary_partial.json").exists()
    rows = read_rows(stage / "metrics.jsonl")
    want = REFERENCE["rows"]["resample"]
    assert len(rows) == len(want) == 3
    for got, ref in zip(rows, want, strict=True):
        compared = {k for k in got if not _timing(k)}
        assert compared == set(ref), set(ref) ^ compared
        for key, value in ref.items():
            if isinstance(value, float):
                # sampling_bias_z is the mean of a difference of near-equal float32 sums over its
                # standard error: round-off differences are amplified (seen: 1.6e-5 relative)
                rel = 1e-3 if key == "sampling_bias_z" else 1e-5
                assert got[key] == pytest.approx(value, rel=rel, abs=1e-6), (ref["step"], key)
            else:
                assert got[key] == value, (ref["step"], key)


@pytest.mark.slow
def test_weight_update_mid_episode_versions_and_importance_weights(tmp_path):
    """An episode whose weights change after its first turn: the first turn's tokens carry
    version 0 and their rollout log-probs are policy A's, later tokens version 1 and policy B's.
    The trainer (policy B, version 1) gives them truncated importance weights min(pB/pA, cap)
    and exactly 1 respectively, through packing and the jitted loss's `off_policy_weights`."""
    from jaxswe.agent.loop import run_episode
    from jaxswe.losses import off_policy_weights
    from jaxswe.model import token_logprobs
    from jaxswe.packing import pack_sequences
    from jaxswe.rollout.backends import EmbeddedBackend
    from jaxswe.rollout.engine import EmbeddedEngine
    from jaxswe.rollout.sampler import Sampler
    from jaxswe.rollout.types import SamplingParams

    policy_a, tok = toy_policy(tmp_path / "a", 2, seed=0)
    policy_b, _ = toy_policy(tmp_path / "b", 2, seed=1)
    cfg = policy_a.model_cfg
    sampler = Sampler(cfg, policy_a.params, max_context=128, min_batch_bucket=1, min_prompt_bucket=128)
    backend = EmbeddedBackend(EmbeddedEngine(sampler, max_batch=1), cfg)

    class UpdateAfterFirstTurn:
        calls = 0

        async def generate(self, input_ids, params, **kw):
            gen = await backend.engine.generate(input_ids, params, **kw)
            self.calls += 1
            if self.calls == 1:  # the trainer publishes version 1 while the episode runs
                await backend.sync_weights(policy_b.params, tmp_path / "w", version=1)
            return gen

    async def play():
        try:
            env = ToyEnv(3, 2, max_format_errors=100, require_look=True, show_answer=True)
            sampling = SamplingParams(max_new_tokens=2)
            return await run_episode(
                env, UpdateAfterFirstTurn(), tok, sampling=sampling, max_turns=4, max_context_tokens=128
            )
        finally:
            await backend.close()

    traj = asyncio.run(play())
    ep = traj
    versions, mask = np.asarray(ep.policy_versions), np.asarray(ep.loss_mask) > 0
    assert ep.num_turns >= 2 and set(versions[mask]) == {0, 1}, versions
    first_turn_end = np.flatnonzero(mask)[0] + np.argmax(~mask[np.flatnonzero(mask)[0] :])
    assert (versions[:first_turn_end][mask[:first_turn_end]] == 0).all()
    assert (versions[first_turn_end:][mask[first_turn_end:]] == 1).all()
    assert (versions[~mask] == -1).all()

    ids = jnp.asarray([ep.input_ids])
    lp = {v: np.asarray(token_logprobs(p.params, cfg, ids))[0] for v, p in ((0, policy_a), (1, policy_b))}
    rollout = np.asarray(ep.rollout_logprobs)
    for v in (0, 1):  # every token's rollout log-prob is that of the version that sampled it
        np.testing.assert_allclose(rollout[mask & (versions == v)], lp[v][mask & (versions == v)], atol=2e-5)

    batch = pack_sequences([ep.rl_sequence(1.0)], 128).arrays
    np.testing.assert_array_equal(batch.policy_versions[0, : len(versions)], versions)
    old = np.zeros_like(batch.rollout_logprobs)
    old[0, : len(versions)] = lp[1]  # the trainer holds version 1
    cap = 2.0
    weights, aux = jax.jit(lambda o, r, m, s: off_policy_weights(o, r, m, s, tis_cap=cap))(
        old, batch.rollout_logprobs, batch.loss_mask, batch.segment_ids
    )
    w = np.asarray(weights)[0, : len(versions)]
    m = np.asarray(batch.loss_mask)[0, : len(versions)] > 0
    np.testing.assert_allclose(w[m & (versions == 1)], 1.0, atol=1e-4)
    want = np.minimum(np.exp(lp[1] - lp[0]), cap)
    np.testing.assert_allclose(w[m & (versions == 0)], want[m & (versions == 0)], rtol=1e-4)
    assert float(aux["offpolicy_weight_max"]) == pytest.approx(w[m].max(), rel=1e-6)
    assert (w[~m] == 0).all()


def test_stale_tokens_are_not_trained_and_staleness_is_measured():
    """Tokens more than k versions behind are not trained (rl.stale_tokens "drop"; then the
    "trajectory" and "keep" rules), the rest of their group is: a group
    with a fresh token is trainable, one without is not; the trained sequences keep only fresh
    tokens (an all-stale trajectory is not packed, its outcome still in the advantages);
    staleness_stats describes the trained tokens and the stale fraction left out."""
    from jaxswe.errors import UserError
    from jaxswe.rl.groups import Scored, check_versioned, judge, staleness_stats, trainable
    from jaxswe.rl.train import training_sequences

    def ep(versions, resolved):
        return _episode("t", versions, resolved)

    spans = [ep([-1, 1, 2, -1, 4], True), ep([-1, 2, 2], False)]  # k = 2 at version 4: min version 2
    stale = [ep([-1, 1, 1], True), ep([-1, 0], False)]
    assert trainable(spans, 2) and not trainable(stale, 2)
    check_versioned(spans)
    with pytest.raises(UserError, match="weight_version"):  # an engine that reports no versions
        unversioned = _episode("t", [-1, -1], True)
        unversioned.loss_mask = [0, 1]
        check_versioned([unversioned, *spans])
    stats = staleness_stats([spans, stale], [True, False], 4, 2)
    # spans' sampled lags: 3 (masked), 2, 0, 2, 2
    assert stats["staleness_max"] == 2 and stats["staleness_mean"] == pytest.approx(6 / 4)
    assert stats["staleness_masked_frac"] == pytest.approx(1 / 5)
    assert stats["staleness_frac_0"] == pytest.approx(1 / 4) and stats["staleness_frac_2"] == pytest.approx(
        3 / 4
    )
    assert stats["staleness_frac_1"] == 0.0 and stats["trajectories_stale"] == 0
    # an all-stale trajectory in a kept group is counted; dropped groups are not
    assert staleness_stats([spans + stale, stale], [True, False], 4, 2)["trajectories_stale"] == 2

    groups = [spans, [ep([-1, 1, 1], True), ep([-1, 3], False)]]
    rewards = [[1.0, 0.0], [1.0, 0.0]]
    c = Scored(groups, rewards, judge(groups, rewards), [True, True], min_version=2)
    seqs, dropped = training_sequences(c)
    assert dropped == [] and len(seqs) == 3  # the all-stale trajectory of the second group is left out
    np.testing.assert_array_equal(seqs[0].loss_mask, [0, 0, 1, 0, 1])
    np.testing.assert_array_equal(seqs[1].loss_mask, [0, 1, 1])
    assert seqs[2].advantage == pytest.approx(c.result.advantages[1][1]) and seqs[2].loss_mask.tolist() == [
        0,
        1,
    ]

    # rl.stale_tokens "trajectory": a trajectory with a stale token trains not at all
    masks = lambda seqs: [s.loss_mask.tolist() for s in seqs]
    assert masks(training_sequences(c, "trajectory")[0]) == [[0, 1, 1], [0, 1]]
    assert trainable(spans, 2, "trajectory") and not trainable([spans[0]], 2, "trajectory")
    stats = staleness_stats([spans, stale], [True, False], 4, 2, "trajectory")
    assert stats["staleness_mean"] == 2 and stats["staleness_masked_frac"] == pytest.approx(3 / 5)
    assert stats["trajectories_stale"] == 1
    # "keep": every sampled token trains, however old
    assert masks(training_sequences(c, "keep")[0]) == [[0, 1, 1, 0, 1], [0, 1, 1], [0, 1, 1], [0, 1]]
    assert trainable(stale, 2, "keep")
    stats = staleness_stats([spans, stale], [True, False], 4, 2, "keep")
    assert stats["staleness_max"] == 3 and stats["staleness_masked_frac"] == 0


def test_the_trainer_takes_the_first_drawn_of_the_finished_groups():
    """Of the groups already done the trainer gets the first drawn, not the first to finish (which
    would depend on timing and favour groups of short episodes); with none done, the next to
    finish."""
    from jaxswe.rl.pump import RolloutPump

    pump = object.__new__(RolloutPump)  # its bookkeeping alone: capacity 0 starts no groups
    pump.capacity, pump.outstanding, pump.taken, pump.error, pump.finished = 0, 3, 0, None, {}
    pump.rl_run = types.SimpleNamespace(cfg=None)

    async def takes() -> list[str]:
        pump.changed = asyncio.Event()
        pump.finished.update({5: ["late draw, finished first"], 2: ["early draw, finished second"]})
        got = [await pump._next_group(), await pump._next_group()]

        async def finish_later():
            await asyncio.sleep(0.01)
            pump.finished[9] = ["the next to finish"]
            pump.changed.set()

        waiter = asyncio.create_task(finish_later())
        got.append(await pump._next_group())
        await waiter
        return [(i, g[0]) for i, g in got]

    assert asyncio.run(takes()) == [
        (2, "early draw, finished second"),
        (5, "late draw, finished first"),
        (9, "the next to finish"),
    ]
    assert pump.outstanding == 0


def test_a_take_trains_its_groups_in_draw_order_whatever_finished_first():
    """Group 1 is done first and group 0 only later: the take waits for both (P = 2) and hands
    them over in draw order, so the batches do not depend on which episode was quicker."""
    from jaxswe.config import load_config
    from jaxswe.rl.pump import RolloutPump

    cfg = load_config(ROOT / "configs" / "toy-rl.yaml", ["rl.problems_per_iteration=2", "rl.max_staleness=1"])
    pump = object.__new__(RolloutPump)  # capacity 0 starts no groups
    pump.capacity, pump.outstanding, pump.taken, pump.error, pump.finished = 0, 2, 0, None, {}
    pump.rl_run, pump.order = types.SimpleNamespace(cfg=cfg, backend=types.SimpleNamespace(engine=None)), None

    def group(task: str):  # one win, one loss: informative
        return [_episode(task, [-1, 0], won, logprobs=[0.0, -0.5]) for won in (True, False)]

    async def take():
        pump.changed = asyncio.Event()
        pump.finished[1] = group("drawn second, done first")

        async def finish_later():
            await asyncio.sleep(0.01)
            pump.finished[0] = group("drawn first, done second")
            pump.changed.set()

        waiter = asyncio.create_task(finish_later())
        collected, _ = await pump._take(step=1)
        await waiter
        return collected

    collected = asyncio.run(take())
    tasks = [g[0].task_id for g in collected.scored.groups]
    assert tasks == ["drawn first, done second", "drawn second, done first"]
    assert collected.scored.trained == [True, True] and collected.scored.min_version == -1


def test_sampling_check_reports_nothing_when_every_token_is_stale():
    """With k > 0 the gap and the bias alarm see only tokens of the trainer's version: when there
    are none the row says so (None, 0 tokens), not a perfect 0.0 gap; with some it measures them."""
    from jaxswe.config import RLSection
    from jaxswe.packing import TokenBatch
    from jaxswe.rl.train import check_sampling

    rng = np.random.default_rng(0)
    shape = (2, 6)
    lp = -rng.uniform(0.1, 2.0, shape).astype(np.float32)
    versions = np.full(shape, 3, np.int32)
    batch = TokenBatch(
        input_ids=np.ones(shape, np.int32),
        positions=np.zeros(shape, np.int32),
        segment_ids=np.ones(shape, np.int32),
        loss_mask=np.ones(shape, np.float32),
        rollout_logprobs=lp - 0.5,
        old_logprobs=lp,
        policy_versions=versions,
    )
    dist = (np.full(shape, 1.0, np.float32), np.full(shape, 0.5, np.float32))
    rl = RLSection(bias_alarm_stop=False)
    stale = check_sampling(rl, [batch], [dist], "test", version=4)
    assert stale["sampling_bias_tokens"] == 0 and stale["sampling_bias_alarm"] == 0
    assert stale["logprob_gap_mean_abs"] is None and stale["sampling_bias_z"] is None
    current = check_sampling(rl, [batch], [dist], "test", version=3)
    assert current["sampling_bias_tokens"] == 12
    assert current["logprob_gap_mean_abs"] == pytest.approx(0.5, abs=1e-6)


def _k1_run(run_dir: Path, *sets: str) -> tuple[list[dict], dict[int, dict], object]:
    """configs/toy-rl.yaml at rl.max_staleness=1 through the CLI's code path (open_stage, run_rl) on
    one device (tests/stages/test_stages_handoff.py says why): its rows, every synced version's weights
    and the model config."""
    from jaxswe.config import load_config
    from jaxswe.stages.context import open_stage
    from jaxswe.stages.finish import finish_stage
    from jaxswe.stages.rl import run_rl

    cfg = load_config(CONFIG, ["rl.max_staleness=1", "eval.after_stage=false", "mesh.devices=1", *sets])
    ctx = open_stage(cfg, run_dir, init_from=None)
    backend = ctx.backend.serve()
    weights = {0: jax.tree.map(np.array, ctx.policy.params)}
    sync = backend.sync_weights

    async def keep_versions(params, export_dir, *, version):
        weights[version] = jax.tree.map(np.array, params)
        await sync(params, export_dir, version=version)

    backend.sync_weights = keep_versions
    finish_stage(ctx, *run_rl(ctx, resume=False))
    return read_rows(run_dir / "metrics.jsonl"), weights, ctx.policy.model_cfg


def _check_every_token(run_dir: Path, weights: dict[int, dict], model_cfg) -> list[int]:
    """Each sampled token's rollout log-prob (every trajectory file) equals the log-prob that the
    version that sampled it gives it, recomputed by the model code; returns the versions seen."""
    from jaxswe.agent.trajectory import load_jsonl
    from jaxswe.model import token_logprobs

    episodes = [e for p in sorted((run_dir / "trajectories").glob("iter_*.jsonl")) for e in load_jsonl(p)]
    width = max(len(e.input_ids) for e in episodes)
    ids = np.zeros((len(episodes), width), np.int32)  # right-padded: causal, so padding changes nothing
    versions = np.full((len(episodes), width), -1)
    rollout = np.zeros((len(episodes), width), np.float32)
    for i, e in enumerate(episodes):
        n = len(e.input_ids)
        ids[i, :n], versions[i, :n], rollout[i, :n] = e.input_ids, e.policy_versions, e.rollout_logprobs
    logprobs = jax.jit(lambda p, x: token_logprobs(p, model_cfg, x))
    checked = sorted(set(versions[versions >= 0].tolist()))
    for v in checked:
        rows = np.flatnonzero((versions == v).any(axis=1))  # the episodes with a token of version v
        bucket = 1 << (len(rows) - 1).bit_length()  # a few compiled batch sizes, not one per version
        batch = np.zeros((bucket, width), np.int32)
        batch[: len(rows)] = ids[rows]
        want = np.asarray(logprobs(weights[v], jnp.asarray(batch)))[: len(rows)]
        mine = versions[rows] == v
        np.testing.assert_allclose(rollout[rows][mine], want[mine], atol=5e-5, err_msg=f"version {v}")
    return checked


K1_ITERATIONS = 24  # of the config's 30: the config's seed reaches 0.8 at 17, seed 5 at 20


@pytest.mark.slow
def test_toy_rl_learns_at_max_staleness_1_and_every_token_has_its_versions_log_prob(tmp_path):
    """`jaxswe rl --config configs/toy-rl.yaml --set rl.max_staleness=1` (one step behind, partial
    rollouts, truncated importance sampling by default), at the config's own seed, learns from a
    random init to the synchronous loop's 0.8 within 24 iterations, and every trained token is at
    most one version behind. Unlike k = 0, the run depends on timing (a take hands over the groups
    done when it looks), so under load the curve moves (at lr 3e-3 the config's seed reached 0.92
    at 20 under the suite's load, then fell to 0.5); hence reaching 0.8 is the claim, not holding
    it. At the config's lr 2e-3, over seeds 1-12 k = 1 reached 0.8 at 12 (k = 0: 11), a median
    0.98x k = 0's trained samples; the config's seed at 17 (docs/performance.md). Where the
    config's seed does not reach it, seed 5 (0.8 at 20) must.

    The sampling check sees only tokens of the trainer's own version, so with k > 0 it cannot vouch
    for the rollouts; this does: the run keeps every synced version's weights, and each sampled
    token's rollout log-prob equals that version's log-prob of it."""
    rows, weights, model_cfg = _k1_run(tmp_path / "rl", f"rl.iterations={K1_ITERATIONS}")
    rates = [r["pass_rate"] for r in rows]
    print("pass rates", rates)
    assert len(rows) == K1_ITERATIONS and all(
        r["staleness_max"] <= 1 and r["infra_failures"] == 0 for r in rows
    )
    assert all(r["tis_clip_fraction"] >= 0 for r in rows if r.get("optimizer_steps"))  # TIS is on
    assert rates[0] <= 0.2, rates
    checked = _check_every_token(tmp_path / "rl", weights, model_cfg)
    # iteration i takes episodes sampled by versions i - 2 and i - 1; the last version (after the
    # last iteration) samples nothing that is saved
    assert set(range(len(rows) - 1)) <= set(checked) <= set(range(len(rows))), checked
    # 64 episodes at 0.8 sit more than 4 standard errors above the 0.5 of looking, then guessing
    if max(rates) < 0.8:
        rows, _, _ = _k1_run(tmp_path / "seed5", f"rl.iterations={K1_ITERATIONS}", "seed=5")
        rates = [r["pass_rate"] for r in rows]
        print("seed 5 pass rates", rates)
    assert max(rates) >= 0.8, rates
