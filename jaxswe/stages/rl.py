"""Synchronous on-policy DAPO RL (stages 1 and 2 of the paper).

Each iteration: P problems x G rollouts -> shaped rewards -> group advantages (uninformative
groups dropped, infra failures excluded) -> packed token batches -> the trainer recomputes
old log-probs (the rollout-vs-trainer gap is logged) -> one epoch in k DAPO optimizer steps ->
weights pushed to the rollout engine -> Orbax checkpoint (params, optimizer, iteration, RNG
seed, success history, data order, this iteration's metrics row) -> the metrics row.

The loop takes any task ids and an `Environment` factory, so toy environments run through the
very same code as SWE tasks.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from jaxswe.config import RLSection, RunConfig
from jaxswe.data.packing import Sequence, pack_sequences, pad_rows, split_rows
from jaxswe.distributed import is_main
from jaxswe.errors import UserError
from jaxswe.rollout.bias import BiasAlarm, sampling_bias
from jaxswe.rollout.client import logprob_gap
from jaxswe.rollout.types import SamplingParams, derive_seed
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.run.metrics import MetricsLogger, read_rows
from jaxswe.run.plots import plot_metrics
from jaxswe.stages.episodes import Episode, save_episodes
from jaxswe.stages.rl_math import advantage_stats, compute_group_advantages, shaped_rewards
from jaxswe.stages.rollouts import Backend, EnvFactory, collect_episodes, run_phase
from jaxswe.stages.stage_io import write_json
from jaxswe.stages.task_pool import DataOrder, History, next_problems, record_outcomes
from jaxswe.stages.trainer import Trainer


@dataclass
class RLSetup:
    """Everything one RL stage runs with."""

    cfg: RunConfig
    stage_dir: Path
    trainer: Trainer
    backend: Backend
    tokenizer: Any
    make_env: EnvFactory
    pool: list[str]
    stop_token_ids: tuple[int, ...] = ()


def rl_sampling(cfg: RunConfig, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        min_p=r.min_p,
        max_new_tokens=r.max_new_tokens,
        stop_token_ids=stop_token_ids,
    )


def _group(episodes: list[Episode], size: int) -> list[list[Episode]]:
    return [episodes[i : i + size] for i in range(0, len(episodes), size)]


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


def minibatches(
    seqs: list[Sequence], rl: RLSection, rows_multiple: int, rng: np.random.Generator
) -> tuple[list[dict[str, np.ndarray]], int]:
    """Shuffle the trajectories into ceil(n / trajectories_per_step) mini-batches of random
    trajectories (so no step sees only long failures or only short successes) and pack each into
    rows; returns the per-step arrays and how many trajectories were cut to seq_len. With
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


def _flat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([x.reshape(-1) for x in parts]) if parts else np.zeros(0, np.float32)


def _check_sampling(
    setup: RLSetup, steps: list[dict[str, np.ndarray]], lp_ent: list, dropped: list[Sequence], step: int
) -> dict[str, Any]:
    """The rollout-vs-trainer log-prob gap and the sampling-bias statistics of every sampled token
    of the iteration: the trained steps' recomputed log-probs, plus a forward pass over the
    trajectories of dropped groups (a server that truncates must be caught even in an iteration
    where no group is informative). Raises when the alarm fires and rl.bias_alarm_stop is set."""
    rl, trainer = setup.cfg.rl, setup.trainer
    steps, lp_ent = list(steps), list(lp_ent)
    if dropped:
        extra, _ = minibatches(dropped, rl, trainer.rows_multiple, np.random.default_rng(0))
        steps += extra
        lp_ent += [trainer.logprobs(arrays) for arrays in extra]
    mask = _flat([a["loss_mask"] for a in steps]) > 0
    trainer_lp = _flat([lp for lp, _ in lp_ent])
    gap = logprob_gap(_flat([a["old_logprobs"] for a in steps]), trainer_lp, mask)
    bias = sampling_bias(trainer_lp, _flat([e for _, e in lp_ent]), mask)
    alarm = BiasAlarm(min_nats=rl.bias_alarm_nats, z=rl.bias_alarm_z, stop=rl.bias_alarm_stop)
    fired = alarm.check(bias, where=f"jaxswe rl iteration {step}", gap_kl=gap["kl"])
    return {
        "logprob_gap_mean_abs": gap["mean_abs"],
        "logprob_gap_max_abs": gap["max_abs"],
        "logprob_gap_kl": gap["kl"],
        **bias,
        "sampling_bias_alarm": int(fired),
    }


def _train_on(
    setup: RLSetup,
    groups: list[list[Episode]],
    advantages: list[list[float]],
    kept: list[bool],
    rng: np.random.Generator,
    step: int,
):
    """Pack kept trajectories, recompute old log-probs, check the sampling-bias alarm over all
    scored trajectories (before any update: a stop leaves the weights untouched), run the DAPO
    steps; return metrics."""
    rl, trainer = setup.cfg.rl, setup.trainer
    seqs, dropped = [], []
    for grp, adv_g, keep in zip(groups, advantages, kept, strict=True):
        for ep, adv in zip(grp, adv_g, strict=True):
            if ep.infra_error is None:
                (seqs if keep else dropped).append(ep.rl_sequence(adv))
    out: dict[str, Any] = {"trajectories_trained": len(seqs), "optimizer_steps": 0}
    steps, truncated = minibatches(seqs, rl, trainer.rows_multiple, rng) if seqs else ([], 0)
    # Old log-probs recomputed by the trainer before any update, in the steps' shapes.
    lp_ent = [trainer.logprobs(arrays) for arrays in steps]
    if seqs or dropped:
        out.update(_check_sampling(setup, steps, lp_ent, dropped, step))
    if not seqs:
        return out
    mask = _flat([a["loss_mask"] for a in steps]) > 0
    entropy = _flat([ent for _, ent in lp_ent])
    for arrays, (lp, _) in zip(steps, lp_ent, strict=True):
        if rl.tis_correction:
            weights = np.minimum(np.exp(np.clip(lp - arrays["old_logprobs"], -20, 20)), rl.tis_cap)
            arrays["token_weights"] = np.where(arrays["loss_mask"] > 0, weights, 0.0).astype(np.float32)
        arrays["old_logprobs"] = lp
    step_metrics = []
    t0 = time.perf_counter()
    for arrays in steps:
        step_metrics.append(trainer.dapo_update(arrays))
    train_s = time.perf_counter() - t0
    tokens = float(mask.sum())
    out.update(
        {
            "optimizer_steps": len(step_metrics),
            "tokens_trained": tokens,
            "sequences_truncated": truncated,
            "entropy": float(entropy[mask].mean()) if mask.any() else None,
            "train_tokens_per_s": tokens / max(train_s, 1e-9),
        }
    )
    for key in ("loss", "clip_fraction", "approx_kl", "ratio_mean", "grad_norm"):
        out[key] = float(np.mean([m[key] for m in step_metrics]))
    return out


async def _iteration(setup: RLSetup, sampling: SamplingParams, order: DataOrder, history: History, step: int):
    """RL iteration `step` (1-based); returns (metrics row, new order, new history, episodes with
    extras)."""
    cfg, rl = setup.cfg, setup.cfg.rl
    timings = Counter()
    t_iter = time.perf_counter()
    problems, order = next_problems(setup.pool, rl.problems_per_iteration, order, cfg.seed)
    groups: list[list[Episode]] = []
    rewards: list[list[float]] = []
    result = None
    rounds = 0
    while True:
        eps, secs = await collect_episodes(
            [t for t in problems for _ in range(rl.group_size)],
            setup.make_env,
            setup.backend.engine,
            setup.tokenizer,
            replace(sampling, sampling_seed=derive_seed(cfg.seed, "rl", step, rounds)),
            cfg.agent,
            concurrency=cfg.env.max_parallel,
        )
        timings["time_rollout_s"] += secs
        timings["time_grading_s"] += sum(e.grading_s for e in eps)  # summed over parallel episodes
        new_groups = _group(eps, rl.group_size)
        groups += new_groups
        for grp in new_groups:
            rewards.append(
                shaped_rewards(
                    np.array([e.resolved for e in grp]),
                    np.array([e.num_turns for e in grp]),
                    threshold=rl.turn_penalty_threshold,
                    max_turns=cfg.agent.max_turns,
                ).tolist()
            )
        result = compute_group_advantages(rewards, [[e.infra_error is not None for e in g] for g in groups])
        missing = rl.problems_per_iteration - result.groups_kept
        if not rl.resample_to_fill or missing <= 0 or rounds >= rl.max_resample_rounds:
            break
        rounds += 1
        problems, order = next_problems(setup.pool, missing, order, cfg.seed)
    kept = list(result.kept)
    # DAPO's dynamic sampling trains on at most P informative groups.
    excess = [i for i, k in enumerate(kept) if k][rl.problems_per_iteration :]
    for i in excess:
        kept[i] = False
    all_eps = [e for g in groups for e in g]
    t0 = time.perf_counter()
    train = _train_on(setup, groups, result.advantages, kept, np.random.default_rng([cfg.seed, step]), step)
    timings["time_train_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    export_dir = setup.stage_dir / "weights"
    await setup.backend.sync_weights(setup.trainer.params, export_dir, version=step)
    timings["time_weight_sync_s"] = time.perf_counter() - t0
    history = record_outcomes(
        history,
        [(g[0].task_id, [e.resolved for e in g if e.infra_error is None]) for g in groups],
    )
    generated = sum(e.num_generated for e in all_eps)
    flat_rewards = [r for g, rg in zip(groups, rewards, strict=True) for e, r in zip(g, rg, strict=True)
                    if e.infra_error is None]  # fmt: skip
    row = {
        "reward_mean": float(np.mean(flat_rewards)) if flat_rewards else 0.0,
        **_episode_stats(all_eps),
        **advantage_stats(result),
        "groups_total": len(groups),
        "groups_kept": sum(kept),
        "resample_rounds": rounds,
        "infra_failures": result.infra_failures,
        "tamper_flags": sum(e.tampered for e in all_eps),
        "tokens_generated": generated,
        "tokens_per_s": generated / max(timings["time_rollout_s"], 1e-9),
        **train,
        **timings,
        "time_iteration_s": time.perf_counter() - t_iter,
    }
    extras = []
    for rg, ag, keep in zip(rewards, result.advantages, kept, strict=True):
        extras += [{"reward": r, "advantage": a, "group_kept": keep} for r, a in zip(rg, ag, strict=True)]
    return row, order, history, all_eps, extras


def run_rl(setup: RLSetup, *, resume: bool, history: History | None = None) -> dict[str, Any]:
    """Run (or resume) the configured number of iterations; return the stage summary."""
    cfg, stage_dir = setup.cfg, setup.stage_dir
    ckpts = Checkpoints(stage_dir / "checkpoints", max_to_keep=2)
    history = dict(history or {})
    order = DataOrder()
    start = 0
    last_row = None
    if ckpts.steps() and not resume:
        raise UserError(f"{stage_dir}: holds RL checkpoints already; pass --resume or use a new --run-dir")
    if resume:
        restored = ckpts.restore_latest(setup.trainer.state())
        if restored is not None:
            start, items, meta = restored
            setup.trainer.load_state(items)
            history = {k: list(v) for k, v in meta["history"].items()}
            order = DataOrder.from_json(meta["data_order"])
            last_row = meta.get("metrics_row")
            print(f"jaxswe: resuming RL from iteration {start} ({ckpts.directory / str(start)})")
    metrics = MetricsLogger(stage_dir, start_step=start + 1)
    if last_row is not None and not any(r["step"] == start for r in read_rows(metrics.path)):
        metrics.log(start, last_row)  # killed after the checkpoint committed, before the row
    sampling = rl_sampling(cfg, setup.stop_token_ids)

    async def loop() -> None:
        nonlocal order, history
        if start > 0:
            await setup.backend.sync_weights(setup.trainer.params, stage_dir / "weights", version=start)
        bar = tqdm(range(start, cfg.rl.iterations), desc="rl", initial=start, total=cfg.rl.iterations)
        for it in bar:
            step = it + 1
            row, order, history, eps, extras = await _iteration(setup, sampling, order, history, step)
            save_episodes(stage_dir / "trajectories" / f"iter_{step:04d}.jsonl", eps, extras)
            meta = {
                "iteration": step,
                "seed": cfg.seed,
                "rng": [cfg.seed, step],
                "data_order": order.to_json(),
                "history": history,
                "metrics_row": row,
            }
            ckpts.save(step, setup.trainer.state(), meta)
            write_json(stage_dir / "history.json", history)
            metrics.log(step, row)
            bar.set_postfix(reward=f"{row['reward_mean']:.2f}", passed=f"{row['pass_rate']:.2f}")

    run_phase(setup.backend, loop())
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
