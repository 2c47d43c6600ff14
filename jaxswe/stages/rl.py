"""DAPO RL (stages 1 and 2 of the paper): one iteration reads top to bottom in `_iteration`.

collect (P problems x G episodes, graded in fresh sandboxes) -> rewards (outcome + turn penalty)
-> advantages (group-normalized; uninformative groups dropped, infra failures excluded) -> pack
(TokenBatch rows with the rollout's log-probs) -> recompute (the trainer's old log-probs; the
rollout-vs-trainer gap and the sampling-bias alarm) -> update (one epoch in k DAPO optimizer
steps; the off-policy correction is computed inside the jitted loss) -> sync (weights pushed to
the rollout engine as policy version `step`) -> Orbax checkpoint -> the metrics row.

With rl.max_staleness = 0 (the default) collection is the paper's synchronous loop: every episode
of iteration `step` is sampled by policy version step - 1. With k > 0 the groups come from a
`RolloutPump` (jaxswe.stages.rl_async) that keeps episodes in flight while the trainer works; a
token sampled more than k versions before the trainer's is never trained.

The loop takes any task ids and an `Environment` factory, so toy environments run through the
very same code as SWE tasks.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from tqdm import tqdm

from jaxswe.config import RLSection, RunConfig
from jaxswe.data.packing import Sequence, TokenBatch, pack_sequences, pad_rows, split_rows
from jaxswe.distributed import is_main
from jaxswe.errors import UserError
from jaxswe.rollout.bias import BiasAlarm, sampling_bias
from jaxswe.rollout.client import logprob_gap
from jaxswe.rollout.types import derive_seed
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.run.metrics import MetricsLogger, read_rows
from jaxswe.run.plots import plot_metrics
from jaxswe.stages.context import StageContext
from jaxswe.stages.episodes import Episode, save_episodes
from jaxswe.stages.rl_math import GroupResult, advantage_stats, compute_group_advantages, shaped_rewards
from jaxswe.stages.rollouts import collect_episodes, run_phase
from jaxswe.stages.runtime import Policy
from jaxswe.stages.stage_io import write_json
from jaxswe.stages.task_pool import DataOrder, History, next_problems, record_outcomes
from jaxswe.stages.trainer import Trainer


def rl_trainer(cfg: RunConfig, policy: Policy) -> Trainer:
    """The Trainer of an RL stage from its starting policy: DAPO's clip range, entropy bonus and
    off-policy correction."""
    rl = cfg.rl
    return Trainer(
        policy.model_cfg,
        policy.params,
        cfg.optimizer,
        eps_low=rl.eps_low,
        eps_high=rl.eps_high,
        entropy_coef=rl.entropy_coef,
        tis_cap=rl.tis_cap if rl.tis_on else None,
        sequence_mask=rl.sequence_mask,
        mask_threshold=rl.mask_threshold,
        mesh_cfg=cfg.mesh,
    )


# -- collect -> grade -> rewards -> advantages ---------------------------------------------------
@dataclass
class Collected:
    """The judged groups one iteration trains from (`kept` marks the informative ones it uses)."""

    groups: list[list[Episode]]
    rewards: list[list[float]]
    result: GroupResult
    kept: list[bool]
    rounds: int = 0
    timings: Counter = field(default_factory=Counter)
    extra: dict[str, float] = field(default_factory=dict)  # async: staleness metrics
    min_version: int | None = None  # async: tokens sampled by older policy versions are not trained


def group_rewards(group: list[Episode], cfg: RunConfig) -> list[float]:
    """Shaped rewards (outcome + turn penalty) of one group's episodes."""
    return shaped_rewards(
        np.array([e.resolved for e in group]),
        np.array([e.num_turns for e in group]),
        threshold=cfg.rl.turn_penalty_threshold,
        max_turns=cfg.agent.max_turns,
    ).tolist()


def judge(groups: list[list[Episode]], rewards: list[list[float]]) -> GroupResult:
    return compute_group_advantages(rewards, [[e.infra_error is not None for e in g] for g in groups])


def first_kept(kept: list[bool], limit: int) -> list[bool]:
    """DAPO's dynamic sampling trains on at most `limit` informative groups (the first ones)."""
    first = set([i for i, k in enumerate(kept) if k][:limit])
    return [i in first for i in range(len(kept))]


async def collect_sync(ctx: StageContext, order: DataOrder, step: int) -> tuple[Collected, DataOrder]:
    """The synchronous collection: P x G episodes at once, resampled (rl.resample_to_fill) until
    P groups are informative or the rounds run out."""
    cfg, rl = ctx.cfg, ctx.cfg.rl
    problems, order = next_problems(ctx.task_ids, rl.problems_per_iteration, order, cfg.seed)
    groups, rewards, timings, rounds = [], [], Counter(), 0
    while True:
        eps, secs = await collect_episodes(
            [t for t in problems for _ in range(rl.group_size)],
            ctx.make_env,
            ctx.backend.engine,
            ctx.tokenizer,
            replace(ctx.sampling, sampling_seed=derive_seed(cfg.seed, "rl", step, rounds)),
            cfg.agent,
            concurrency=cfg.env.max_parallel,
        )
        timings["time_rollout_s"] += secs
        timings["time_grading_s"] += sum(e.grading_s for e in eps)  # summed over parallel episodes
        new = [eps[i : i + rl.group_size] for i in range(0, len(eps), rl.group_size)]
        groups += new
        rewards += [group_rewards(g, cfg) for g in new]
        result = judge(groups, rewards)
        missing = rl.problems_per_iteration - result.groups_kept
        if not rl.resample_to_fill or missing <= 0 or rounds >= rl.max_resample_rounds:
            break
        rounds += 1
        problems, order = next_problems(ctx.task_ids, missing, order, cfg.seed)
    kept = first_kept(list(result.kept), rl.problems_per_iteration)
    return Collected(groups, rewards, result, kept, rounds, timings), order


# -- pack -> recompute -> update -----------------------------------------------------------------
def fresh_tokens(seq: Sequence, min_version: int) -> Sequence:
    """`seq` with the tokens sampled by policy versions before `min_version` not trained."""
    return replace(seq, loss_mask=seq.loss_mask * (seq.policy_versions >= min_version))


def training_sequences(c: Collected) -> tuple[list[Sequence], list[Sequence]]:
    """(trained, dropped) sequences: the scored episodes of kept groups with their advantages, and
    those of dropped groups (only checked for sampling bias). With `c.min_version` (async) only
    the tokens sampled by that version or later are trained, and a trajectory left with none is
    not packed (its outcome still counted in its group's advantages)."""
    seqs, dropped = [], []
    for grp, adv_g, keep in zip(c.groups, c.result.advantages, c.kept, strict=True):
        for ep, adv in zip(grp, adv_g, strict=True):
            if ep.infra_error is not None:
                continue
            seq = ep.rl_sequence(adv)
            if c.min_version is not None:
                seq = fresh_tokens(seq, c.min_version)
                if not seq.loss_mask.any():
                    continue
            (seqs if keep else dropped).append(seq)
    return seqs, dropped


def minibatches(
    seqs: list[Sequence], rl: RLSection, rows_multiple: int, rng: np.random.Generator
) -> tuple[list[TokenBatch], int]:
    """Shuffle the trajectories into ceil(n / trajectories_per_step) mini-batches of random
    trajectories (so no step sees only long failures or only short successes) and pack each into
    rows; returns the per-step batches and how many trajectories were cut to seq_len. With
    `rows_per_step` every step has exactly that many rows (one compiled shape): a mini-batch that
    packs into more rows is split over several steps."""
    order = rng.permutation(len(seqs))
    num_batches = max(1, math.ceil(len(seqs) / rl.trajectories_per_step))
    fixed = rl.rows_per_step
    steps, truncated = [], 0
    for chosen in np.array_split(order, num_batches):
        batch = pack_sequences(
            [seqs[i] for i in chosen],
            rl.seq_len,
            rows_multiple=1 if fixed else rows_multiple,
            power_of_two_rows=fixed is None,
        )
        truncated += batch.truncated
        if not fixed:
            steps.append(batch.arrays)
            continue
        for start, stop in split_rows(batch.num_rows, math.ceil(batch.num_rows / fixed)):
            steps.append(pad_rows(batch.rows(start, stop), fixed))
    return steps, truncated


Dist = tuple[np.ndarray, np.ndarray]  # the trainer's entropy and surprisal variance [B, T] of a batch


def recompute(trainer: Trainer, steps: list[TokenBatch]) -> tuple[list[TokenBatch], list[Dist]]:
    """The steps with the trainer's old log-probs (before any update), and their `Dist`s."""
    out, dists = [], []
    for batch in steps:
        lp, ent, var = trainer.logprobs(batch)
        out.append(batch._replace(old_logprobs=lp))
        dists.append((ent, var))
    return out, dists


def _flat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([x.reshape(-1) for x in parts]) if parts else np.zeros(0, np.float32)


BIAS_KEYS = ("sampling_bias_nats", "sampling_bias_z", "sampling_surprisal", "sampling_entropy")


def check_sampling(
    rl: RLSection, steps: list[TokenBatch], dists: list[Dist], where: str, version: int | None
) -> dict[str, Any]:
    """The rollout-vs-trainer log-prob gap and the sampling-bias statistics of the sampled tokens
    of `steps` (recomputed, not yet updated); with `version`, of the tokens that policy version
    sampled (older ones differ from the trainer by design). None when there is no such token
    (k > 0 and every token is stale: nothing was checked). Raises when the alarm fires and
    rl.bias_alarm_stop."""
    mask = _flat([b.loss_mask for b in steps]) > 0
    if version is not None:
        mask &= _flat([b.policy_versions for b in steps]) == version
    if not mask.any():
        keys = ("logprob_gap_mean_abs", "logprob_gap_max_abs", "logprob_gap_kl", *BIAS_KEYS)
        return dict.fromkeys(keys) | {"sampling_bias_tokens": 0, "sampling_bias_alarm": 0}
    trainer_lp = _flat([b.old_logprobs for b in steps])
    gap = logprob_gap(_flat([b.rollout_logprobs for b in steps]), trainer_lp, mask)
    bias = sampling_bias(trainer_lp, _flat([e for e, _ in dists]), _flat([v for _, v in dists]), mask)
    alarm = BiasAlarm(min_nats=rl.bias_alarm_nats, z=rl.bias_alarm_z, stop=rl.bias_alarm_stop)
    fired = alarm.check(bias, where=where, gap_kl=gap["kl"])
    return {
        "logprob_gap_mean_abs": gap["mean_abs"],
        "logprob_gap_max_abs": gap["max_abs"],
        "logprob_gap_kl": gap["kl"],
        **bias,
        "sampling_bias_alarm": int(fired),
    }


STEP_METRICS = ("loss", "clip_fraction", "approx_kl", "ratio_mean", "grad_norm")
CORRECTION_METRICS = ("offpolicy_weight_mean", "tis_clip_fraction", "offpolicy_masked_fraction")


def update(trainer: Trainer, steps: list[TokenBatch], dists: list[Dist]) -> dict[str, Any]:
    """One DAPO optimizer step per batch; the iteration's training metrics."""
    t0 = time.perf_counter()
    step_metrics = [trainer.dapo_update(batch) for batch in steps]
    train_s = time.perf_counter() - t0
    mask = _flat([b.loss_mask for b in steps]) > 0
    entropy = _flat([e for e, _ in dists])
    tokens = float(mask.sum())
    out = {
        "optimizer_steps": len(step_metrics),
        "tokens_trained": tokens,
        "entropy": float(entropy[mask].mean()) if mask.any() else None,
        "train_tokens_per_s": tokens / max(train_s, 1e-9),
    }
    for key in STEP_METRICS + tuple(k for k in CORRECTION_METRICS if k in step_metrics[0]):
        out[key] = float(np.mean([m[key] for m in step_metrics]))
    if "offpolicy_weight_max" in step_metrics[0]:
        out["offpolicy_weight_max"] = float(max(m["offpolicy_weight_max"] for m in step_metrics))
    return out


def train_on(ctx: StageContext, c: Collected, step: int) -> dict[str, Any]:
    """pack -> recompute -> check sampling (over all scored trajectories, before any update: a
    stop leaves the weights untouched) -> update; returns the training metrics."""
    rl, trainer = ctx.cfg.rl, ctx.trainer
    seqs, dropped = training_sequences(c)
    rng = np.random.default_rng([ctx.cfg.seed, step])
    steps, truncated = minibatches(seqs, rl, trainer.rows_multiple, rng) if seqs else ([], 0)
    steps, dists = recompute(trainer, steps)
    # a server that truncates must be caught even in an iteration where no group is informative
    extra, _ = (
        minibatches(dropped, rl, trainer.rows_multiple, np.random.default_rng(0)) if dropped else ([], 0)
    )
    extra, extra_dists = recompute(trainer, extra)
    out: dict[str, Any] = {"trajectories_trained": len(seqs), "optimizer_steps": 0}
    if seqs or dropped:
        where = f"jaxswe rl iteration {step}"
        version = step - 1 if rl.max_staleness else None
        out.update(check_sampling(rl, steps + extra, dists + extra_dists, where, version))
    if seqs:
        out.update(update(trainer, steps, dists), sequences_truncated=truncated)
    return out


# -- one iteration -------------------------------------------------------------------------------
def _episode_stats(episodes: list[Episode]) -> dict[str, float]:
    scored = [e for e in episodes if e.infra_error is None]
    n = max(len(scored), 1)
    ends = Counter(e.ended_by for e in scored)
    return {
        "pass_rate": sum(e.resolved for e in scored) / n,
        "mean_turns": float(np.mean([e.num_turns for e in scored])) if scored else 0.0,
        "submit_ratio": ends.get("submitted", 0) / n,
        "ended_by_limit_ratio": (ends.get("max_turns", 0) + ends.get("context", 0)) / n,
        "episodes": len(episodes),
    }


async def _iteration(ctx: StageContext, collect: Any, order: DataOrder, history: History, step: int):
    """RL iteration `step` (1-based), top to bottom; returns (metrics row, new order, new history,
    episodes, their per-episode extras). `collect(order, step)` -> (Collected, order) gathers the
    judged groups (collect_sync, or a RolloutPump's take)."""
    t_iter = time.perf_counter()
    c, order = await collect(order, step)  # collect -> grade -> rewards -> advantages
    t0 = time.perf_counter()
    if ctx.cfg.rl.max_staleness:  # rollouts keep running while the trainer works
        train = await asyncio.to_thread(train_on, ctx, c, step)
    else:
        train = train_on(ctx, c, step)  # pack -> recompute -> update
    c.timings["time_train_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    await ctx.backend.sync_weights(ctx.trainer.params, ctx.stage_dir / "weights", version=step)
    c.timings["time_weight_sync_s"] = time.perf_counter() - t0
    history = record_outcomes(
        history, [(g[0].task_id, [e.resolved for e in g if e.infra_error is None]) for g in c.groups]
    )
    all_eps = [e for g in c.groups for e in g]
    generated = sum(e.num_generated for e in all_eps)
    flat_rewards = [r for g, rg in zip(c.groups, c.rewards, strict=True) for e, r in zip(g, rg, strict=True)
                    if e.infra_error is None]  # fmt: skip
    row = {
        "reward_mean": float(np.mean(flat_rewards)) if flat_rewards else 0.0,
        **_episode_stats(all_eps),
        **advantage_stats(c.result),
        "groups_total": len(c.groups),
        "groups_kept": sum(c.kept),
        "resample_rounds": c.rounds,
        "infra_failures": c.result.infra_failures,
        "tamper_flags": sum(e.tampered for e in all_eps),
        "tokens_generated": generated,
        "tokens_per_s": generated / max(c.timings["time_rollout_s"], 1e-9),
        **c.extra,
        **train,
        **c.timings,
        "time_iteration_s": time.perf_counter() - t_iter,
    }
    extras = []
    for rg, ag, keep in zip(c.rewards, c.result.advantages, c.kept, strict=True):
        extras += [{"reward": r, "advantage": a, "group_kept": keep} for r, a in zip(rg, ag, strict=True)]
    return row, order, history, all_eps, extras


def run_rl(ctx: StageContext, *, resume: bool, history: History | None = None) -> dict[str, Any]:
    """Run (or resume) the configured number of iterations; return the stage summary.

    Resume is exact for max_staleness 0. With k > 0 the episodes in flight when the checkpoint was
    written are lost: the resumed run starts new episodes under the restored weights, and the
    problems drawn for the lost ones are not drawn again before the epoch ends."""
    cfg, stage_dir = ctx.cfg, ctx.stage_dir
    ckpts = Checkpoints(stage_dir / "checkpoints", max_to_keep=2)
    history = dict(history or {})
    order = DataOrder()
    start = 0
    last_row = None
    if ckpts.steps() and not resume:
        raise UserError(f"{stage_dir}: holds RL checkpoints already; pass --resume or use a new --run-dir")
    if resume:
        restored = ckpts.restore_latest(ctx.trainer.state())
        if restored is not None:
            start, items, meta = restored
            ctx.trainer.load_state(items)
            history = {k: list(v) for k, v in meta["history"].items()}
            order = DataOrder.from_json(meta["data_order"])
            last_row = meta.get("metrics_row")
            print(f"jaxswe: resuming RL from iteration {start} ({ckpts.directory / str(start)})")
    metrics = MetricsLogger(stage_dir, start_step=start + 1)
    if last_row is not None and not any(r["step"] == start for r in read_rows(metrics.path)):
        metrics.log(start, last_row)  # killed after the checkpoint committed, before the row

    async def loop() -> None:
        nonlocal order, history
        if start > 0:
            await ctx.backend.sync_weights(ctx.trainer.params, stage_dir / "weights", version=start)
        pump = None
        collect = lambda order, step: collect_sync(ctx, order, step)
        if cfg.rl.max_staleness:
            from jaxswe.stages.rl_async import RolloutPump

            pump = RolloutPump(ctx, order)
            collect = pump.take
        bar = tqdm(
            range(start, cfg.rl.iterations),
            desc="rl",
            initial=start,
            total=cfg.rl.iterations,
            disable=not is_main(),  # one progress bar per run, not per process
        )
        try:
            for it in bar:
                step = it + 1
                row, order, history, eps, extras = await _iteration(ctx, collect, order, history, step)
                save_episodes(stage_dir / "trajectories" / f"iter_{step:04d}.jsonl", eps, extras)
                meta = {
                    "iteration": step,
                    "seed": cfg.seed,
                    "rng": [cfg.seed, step],
                    "data_order": order.to_json(),
                    "history": history,
                    "metrics_row": row,
                }
                ckpts.save(step, ctx.trainer.state(), meta)
                write_json(stage_dir / "history.json", history)
                metrics.log(step, row)
                bar.set_postfix(reward=f"{row['reward_mean']:.2f}", passed=f"{row['pass_rate']:.2f}")
        finally:
            if pump is not None:
                await pump.stop()

    run_phase(ctx.backend, loop())
    metrics.close()
    ckpts.close()
    if is_main():
        plot_metrics(metrics.path, stage_dir / "plots" / "rl_curves.png", title=f"{cfg.name}: RL")
    rows = read_rows(metrics.path)
    return {
        "name": "rl",
        "iterations": len(rows),
        "final_pass_rate": rows[-1]["pass_rate"] if rows else None,
        "checkpoint": str(ckpts.directory),
    }
