"""The trainer's half of an RL iteration: pack -> recompute -> check sampling (`prepare`), then
the updates (`jaxswe.rl.loop.rl_iteration`) and their metrics (`update_metrics`).

The scored groups (jaxswe.rl.groups) become packed `TokenBatch` rows with the rollout's log-probs;
the trainer recomputes the old log-probs before any update (the rollout-vs-trainer gap and the
sampling-bias alarm read them), then takes one DAPO optimizer step per mini-batch, the off-policy
correction computed inside the jitted loss.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from jaxswe.config import RLSection
from jaxswe.packing import Sequence, TokenBatch, pack_sequences, pad_rows, split_rows
from jaxswe.rl.groups import Scored, trained_tokens
from jaxswe.rl.inputs import RLRun
from jaxswe.rl.pump import Collected
from jaxswe.rollout.bias import BiasAlarm, logprob_gap, sampling_bias
from jaxswe.train.trainer import Trainer


def within_staleness(seq: Sequence, min_version: int, stale_tokens: str) -> Sequence | None:
    """`seq` with only the tokens that train (jaxswe.rl.groups.trained_tokens) in its loss mask
    when `min_version` is the oldest fresh policy version; None when none does."""
    train = trained_tokens(seq.loss_mask, seq.policy_versions, min_version, stale_tokens)
    seq = replace(seq, loss_mask=seq.loss_mask * train)
    return seq if seq.loss_mask.any() else None


def masks_format_errors(mode: str, advantage: float) -> bool:
    """Whether an episode of this advantage trains without its format-error turns (rl.mask_format_errors)."""
    return mode == "always" or (mode == "positive" and advantage > 0)


def training_sequences(
    scored: Scored, stale_tokens: str = "drop", mask_format_errors: str = "never"
) -> tuple[list[Sequence], list[Sequence]]:
    """(trained, dropped) sequences: the scored episodes of trained groups with their advantages,
    and those of the other groups (only checked for sampling bias). Format-error turns leave the loss
    mask as RFT's (`Trajectory.rft_loss_mask`) where `masks_format_errors`. With `scored.min_version`
    (k > 0) stale tokens train as `stale_tokens` says (`within_staleness`); a trajectory left
    with no trained token is not packed, and its outcome still counts in its group's advantages."""
    seqs, dropped = [], []
    for grp, adv_g, keep in zip(scored.groups, scored.result.advantages, scored.trained, strict=True):
        for ep, adv in zip(grp, adv_g, strict=True):
            if ep.infra_error is not None:
                continue
            seq = ep.rl_sequence(adv)
            if masks_format_errors(mask_format_errors, adv):
                seq = replace(seq, loss_mask=ep.rft_loss_mask().astype(np.float32))
                if not seq.loss_mask.any():
                    continue
            if scored.min_version is not None:
                seq = within_staleness(seq, scored.min_version, stale_tokens)
                if seq is None:
                    continue
            (seqs if keep else dropped).append(seq)
    return seqs, dropped


def minibatches(
    seqs: list[Sequence], rl: RLSection, rows_multiple: int, rng: np.random.Generator
) -> tuple[list[TokenBatch], int]:
    """Shuffle the trajectories into ceil(n / trajectories_per_step) mini-batches of random
    trajectories (so no step sees only long failures or only short successes) and pack each into
    rows (padded to a rung of the `rl.row_bucket_ratio` ladder); returns the per-step batches and
    how many trajectories were cut to seq_len. With `rows_per_step` every step has exactly that many
    rows (one compiled shape): a mini-batch that packs into more rows is split over several steps."""
    order = rng.permutation(len(seqs))
    num_batches = max(1, math.ceil(len(seqs) / rl.trajectories_per_step))
    fixed = rl.rows_per_step
    steps, truncated = [], 0
    for chosen in np.array_split(order, num_batches):
        batch = pack_sequences(
            [seqs[i] for i in chosen],
            rl.seq_len,
            rows_multiple=1 if fixed else rows_multiple,
            row_ratio=1.0 if fixed else rl.row_bucket_ratio,
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
# present only when their setting is on (off-policy correction, rl.negative_prob_floor)
CORRECTION_METRICS = (
    "offpolicy_weight_mean",
    "tis_clip_fraction",
    "offpolicy_masked_fraction",
    "prob_floor_fraction",
)


def prepare(rl_run: RLRun, c: Collected, step: int) -> tuple[list[TokenBatch], list[Dist], dict[str, Any]]:
    """pack -> recompute -> check sampling (over all scored trajectories, before any update: a
    stop leaves the weights untouched): the iteration's optimizer-step batches with the trainer's
    old log-probs, their `Dist`s, and the metrics so far."""
    rl, trainer = rl_run.cfg.rl, rl_run.trainer
    seqs, dropped = training_sequences(c.scored, rl.stale_tokens, rl.mask_format_errors)
    rng = np.random.default_rng([rl_run.cfg.seed, step])
    steps, truncated = minibatches(seqs, rl, trainer.rows_multiple, rng) if seqs else ([], 0)
    steps, dists = recompute(trainer, steps)
    # a server that truncates must be caught even in an iteration where no group is informative
    extra, _ = (
        minibatches(dropped, rl, trainer.rows_multiple, np.random.default_rng(0)) if dropped else ([], 0)
    )
    extra, extra_dists = recompute(trainer, extra)
    out: dict[str, Any] = {"trajectories_trained": len(seqs), "optimizer_steps": len(steps)}
    if seqs or dropped:
        where = f"jaxswe rl iteration {step}"
        version = step - 1 if rl.max_staleness else None
        out.update(check_sampling(rl, steps + extra, dists + extra_dists, where, version))
    if seqs:
        out["sequences_truncated"] = truncated
    return steps, dists, out


def update_metrics(
    steps: list[TokenBatch], dists: list[Dist], step_metrics: list[dict[str, float]], train_s: float
) -> dict[str, Any]:
    """The iteration's training metrics from its optimizer steps' (none: nothing trained)."""
    if not step_metrics:
        return {}
    mask = _flat([b.loss_mask for b in steps]) > 0
    entropy = _flat([e for e, _ in dists])
    tokens = float(mask.sum())
    out = {
        "tokens_trained": tokens,
        "entropy": float(entropy[mask].mean()) if mask.any() else None,
        "train_tokens_per_s": tokens / max(train_s, 1e-9),
    }
    for key in STEP_METRICS + tuple(k for k in CORRECTION_METRICS if k in step_metrics[0]):
        out[key] = float(np.mean([m[key] for m in step_metrics]))
    if "offpolicy_weight_max" in step_metrics[0]:
        out["offpolicy_weight_max"] = float(max(m["offpolicy_weight_max"] for m in step_metrics))
    return out


class StepsWarning:
    """One warning per stage for an iteration that takes more optimizer steps than
    `rl.max_optimizer_steps` (the paper reports 2 to 8; None: no check)."""

    def __init__(self, rl: RLSection):
        self.bound = rl.max_optimizer_steps
        self.warned = False

    def __call__(self, optimizer_steps: int) -> str | None:
        """The warning's line the first time `optimizer_steps` passes the bound, else None."""
        if self.warned or self.bound is None or optimizer_steps <= self.bound:
            return None
        self.warned = True
        return (
            f"jaxswe: WARNING: an RL iteration took {optimizer_steps} optimizer steps, more than "
            f"rl.max_optimizer_steps ({self.bound}; the paper reports 2 to 8): later steps train further "
            "off the sampling policy (watch clip_fraction); raise rl.trajectories_per_step or lower "
            "rl.problems_per_iteration (warned once per stage)"
        )
