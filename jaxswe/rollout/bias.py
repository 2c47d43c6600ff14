"""How far the rollout engine's sampling is from the trainer's: the log-prob gap (`logprob_gap`), and
biased sampling, which the gap cannot see.

Engines report log-probs of the untruncated softmax, so when a server applies top-k, top-p, min-p
or a penalty on its side the rollout-vs-trainer log-prob gap stays ~0. What truncation does change
is WHICH tokens get drawn: it favors likely ones. For tokens drawn from the trainer's own
distribution p, the surprisal -log p(x_t) has conditional mean equal to the entropy H(p_t) at that
position, so the per-token deficit `d_t = H(p_t) + log p(x_t)` has mean 0 given the past (a
martingale difference sequence); truncated or sharpened sampling makes it positive.

`sampling_bias` measures the mean deficit in nats per token and its z-score
`sum d_t / sqrt(sum V_t)`, where `V_t = Var_{x~p_t}(-log p_t(x))` is the trainer's own variance of
the surprisal at that position: the martingale CLT's predictable normalizer, valid although the
tokens of one trajectory depend on each other. The variance must come from the distribution, not
from the observed deficits: a peaked policy puts most of its entropy in rare tokens, so a batch
that happens to draw none of them has small, all-positive deficits, and their empirical spread
would call that a z of sqrt(n) (a false alarm on a healthy, near-deterministic policy).
`BiasAlarm` fires when the deficit is both significant (z above `z`) and large (mean above
`min_nats`): the second bound keeps a tiny numerical trainer/engine mismatch (bf16 engine, fp32
trainer) from tripping it on batches of millions of tokens.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxswe.errors import UserError

log = logging.getLogger(__name__)


class BiasedSamplingDetected(UserError):
    """The rollout tokens were not drawn from the model's full softmax at temperature 1."""


def sampling_bias(
    trainer_logprobs: Any, trainer_entropy: Any, surprisal_var: Any, mask: Any
) -> dict[str, float]:
    """Surprisal-vs-entropy statistics of the sampled tokens under `mask` (all [.., T] arrays; the
    trainer's log-probs of the sampled tokens, entropies and surprisal variances).

    Returns `sampling_bias_nats` (mean of entropy - surprisal; 0 in expectation when sampling is
    unbiased, positive under truncation), `sampling_bias_z` (that mean over its standard error
    sqrt(sum var) / n), `sampling_surprisal` and `sampling_entropy` (means) and
    `sampling_bias_tokens`. With no token under the mask every value is 0.
    """
    lp = np.asarray(trainer_logprobs, np.float64)
    ent = np.asarray(trainer_entropy, np.float64)
    var = np.asarray(surprisal_var, np.float64)
    m = np.asarray(mask, bool)
    if not lp.shape == ent.shape == var.shape == m.shape:
        raise ValueError(
            f"shapes differ: logprobs {lp.shape}, entropy {ent.shape}, variance {var.shape}, mask {m.shape}"
        )
    n = int(m.sum())
    if n == 0:
        return dict.fromkeys(
            ("sampling_bias_nats", "sampling_bias_z", "sampling_surprisal", "sampling_entropy"), 0.0
        ) | {"sampling_bias_tokens": 0}
    deficit = ent[m] + lp[m]
    mean = float(deficit.mean())
    se = math.sqrt(float(np.sum(var[m]))) / n
    return {
        "sampling_bias_nats": mean,
        "sampling_bias_z": mean / se if se > 0 else 0.0,
        "sampling_surprisal": float(-lp[m].mean()),
        "sampling_entropy": float(ent[m].mean()),
        "sampling_bias_tokens": n,
    }


@dataclass(frozen=True)
class BiasAlarm:
    """Thresholds on `sampling_bias` and what to do above them (warn, or stop the run)."""

    min_nats: float = 0.01
    z: float = 4.0
    stop: bool = True

    def fires(self, stats: dict[str, float]) -> bool:
        return stats["sampling_bias_z"] > self.z and stats["sampling_bias_nats"] > self.min_nats

    def check(self, stats: dict[str, float], *, where: str, gap_kl: float | None = None) -> bool:
        """Warn loudly (and raise when `stop`) if the alarm fires; returns whether it fired.
        `gap_kl` (the rollout-vs-trainer log-prob gap) goes into the message when given."""
        if not self.fires(stats):
            return False
        gap = "" if gap_kl is None else f"; the log-prob gap KL is {gap_kl:.1e}, blind to this"
        message = (
            f"{where}: BIASED SAMPLING: sampled tokens are {stats['sampling_bias_nats']:.4f} nats/token "
            f"less surprising than the trainer's entropy (z = {stats['sampling_bias_z']:.1f} over "
            f"{stats['sampling_bias_tokens']} tokens; thresholds {self.min_nats} nats, z {self.z}{gap}). "
            "The rollout server is truncating or reshaping the distribution (top-k/top-p/min-p, "
            "penalties or a temperature from its generation_config): RL on these samples degrades"
        )
        log.warning(message)
        print(f"WARNING: {message}", file=sys.stderr, flush=True)
        if self.stop:
            raise BiasedSamplingDetected(
                message + "; stopped before training on them (rl.bias_alarm_stop=false only warns)"
            )
        return True


def logprob_gap(rollout_logprobs: Any, trainer_logprobs: Any, mask: Any) -> dict[str, float]:
    """Mismatch between rollout-engine and trainer log-probs of the same sampled tokens.

    Returns mean and max absolute difference over masked tokens and `kl`, the k3 estimate
    `E[r - 1 - log r]` with `r = p_trainer / p_rollout` of KL(rollout || trainer) (tokens were drawn
    from the rollout engine; non-negative, low variance). All 0.0 when the mask is empty.
    """
    rollout = np.asarray(rollout_logprobs, np.float64)
    trainer = np.asarray(trainer_logprobs, np.float64)
    m = np.asarray(mask, bool)
    if rollout.shape != trainer.shape or rollout.shape != m.shape:
        raise ValueError(f"shapes differ: rollout {rollout.shape}, trainer {trainer.shape}, mask {m.shape}")
    if not m.any():
        return {"mean_abs": 0.0, "max_abs": 0.0, "kl": 0.0}
    diff = (trainer - rollout)[m]
    return {
        "mean_abs": float(np.mean(np.abs(diff))),
        "max_abs": float(np.max(np.abs(diff))),
        "kl": float(np.mean(np.expm1(diff) - diff)),
    }
