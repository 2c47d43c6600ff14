"""Which groups and tokens of an RL iteration train: rewards -> advantages -> one `trained` mask.

Pure functions over plain `Trajectory` values and numpy arrays, one group per problem. A group's
rewards are the binary outcome plus the paper's turn penalty. Infra failures (sandbox died, server
error) are left out of their group's statistics and never scored 0; a group with fewer than two
scored members carries no comparison, nor does one whose rewards are all equal: neither is
informative. With rl.max_staleness k > 0 a token sampled by a policy version more than k behind
the trainer is stale, and trains as rl.stale_tokens says (`trains`); a group trains only when some
token of it does. Of the informative groups that may train, the first P in draw order train
(DAPO's dynamic sampling): `Scorer.score` gives that `trained` mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jaxswe.agent.trajectory import Trajectory
from jaxswe.config import RunConfig
from jaxswe.errors import UserError
from jaxswe.losses import group_advantages, turn_penalty


def shaped_rewards(
    resolved: np.ndarray, num_turns: np.ndarray, *, threshold: int, max_turns: int
) -> np.ndarray:
    """R + R_len per trajectory: the binary outcome plus the paper's turn-count penalty."""
    penalty = np.asarray(turn_penalty(np.asarray(num_turns), threshold=threshold, max_turns=max_turns))
    return np.asarray(resolved, np.float64) + penalty.astype(np.float64)


@dataclass(frozen=True)
class GroupResult:
    """Advantages of one iteration, aligned with the [P][G] input lists."""

    advantages: list[list[float]]  # 0.0 for excluded members and in uninformative groups
    informative: list[bool]  # per group
    infra_failures: int


def informative(rewards: list[float], infra_failed: list[bool]) -> bool:
    """Whether a group's rewards compare: two scored members or more, not all of one reward."""
    scored = [r for r, bad in zip(rewards, infra_failed, strict=True) if not bad]
    return len(scored) >= 2 and len({float(r) for r in scored}) > 1


def compute_group_advantages(
    rewards: list[list[float]], infra_failed: list[list[bool]], *, scale_by_std: bool = True
) -> GroupResult:
    """Group-normalized advantages over the scored members of each informative group
    (`group_advantages`; without `scale_by_std`, mean-centred only)."""
    if len(rewards) != len(infra_failed):
        raise ValueError("rewards and infra_failed must list the same groups")
    advantages: list[list[float]] = []
    informative_groups: list[bool] = []
    for r_g, bad_g in zip(rewards, infra_failed, strict=True):
        if len(r_g) != len(bad_g):
            raise ValueError("each group needs one infra flag per reward")
        adv = [0.0] * len(r_g)
        compares = informative(r_g, bad_g)
        if compares:
            scored = [i for i, bad in enumerate(bad_g) if not bad]
            r_1g = np.asarray([[r_g[i] for i in scored]], np.float32)
            a_1g = np.asarray(group_advantages(r_1g, scale_by_std=scale_by_std))[0]
            for i, a in zip(scored, a_1g, strict=True):
                adv[i] = float(a)
        advantages.append(adv)
        informative_groups.append(compares)
    failures = sum(sum(bad_g) for bad_g in infra_failed)
    return GroupResult(advantages=advantages, informative=informative_groups, infra_failures=failures)


def judge(
    groups: list[list[Trajectory]], rewards: list[list[float]], scale_by_std: bool = True
) -> GroupResult:
    """Advantages and informative groups of episodes (which are informative does not depend on
    `scale_by_std`)."""
    infra = [[e.infra_error is not None for e in g] for g in groups]
    return compute_group_advantages(rewards, infra, scale_by_std=scale_by_std)


def advantage_stats(result: GroupResult, trained: list[bool]) -> dict[str, float]:
    """Mean, std, min, max of the advantages that reach the loss: those of the `trained` groups."""
    a = np.array([x for adv, t in zip(result.advantages, trained, strict=True) if t for x in adv])
    if a.size == 0:
        return {"adv_mean": 0.0, "adv_std": 0.0, "adv_min": 0.0, "adv_max": 0.0}
    return {
        "adv_mean": float(a.mean()),
        "adv_std": float(a.std()),
        "adv_min": float(a.min()),
        "adv_max": float(a.max()),
    }


def sampled_versions(group: list[Trajectory]) -> np.ndarray:
    """The policy version of every sampled token of `group`'s scored episodes."""
    return np.array(
        [
            v
            for e in group
            if e.infra_error is None
            for v, m in zip(e.policy_versions, e.loss_mask, strict=True)
            if m
        ],  # fmt: skip
        np.int64,
    )


def check_versioned(group: list[Trajectory]) -> None:
    """Raise when a sampled token of `group` has no policy version (the engine reported none):
    with k > 0 it could never be told fresh from stale."""
    if (sampled_versions(group) < 0).any():
        raise UserError(
            "rl.max_staleness > 0 needs the policy version of every sampled token, and the rollout "
            "engine reported none (meta_info.weight_version); use an engine that reports it "
            "(jaxswe serve, or an SGLang whose /generate meta_info has weight_version) or rl.max_staleness 0"
        )


def trains(versions: np.ndarray, min_version: int, stale_tokens: str) -> np.ndarray:
    """Which of one trajectory's sampled tokens (their policy `versions`) train when `min_version`
    is the oldest fresh version, by rl.stale_tokens: "drop" the fresh ones; "trajectory" all of
    them when all are fresh, else none; "keep" all (the loss's importance weights correct them)."""
    fresh = versions >= min_version
    if stale_tokens == "drop":
        return fresh
    if stale_tokens == "trajectory":
        return np.full_like(fresh, fresh.all())
    return np.ones_like(fresh)


def trained_tokens(
    loss_mask: np.ndarray, versions: np.ndarray, min_version: int, stale_tokens: str
) -> np.ndarray:
    """One trajectory's trained-token mask: of its sampled tokens (`loss_mask` > 0), those that
    `trains` lets train."""
    sampled = np.asarray(loss_mask) > 0
    mask = np.zeros_like(sampled)
    mask[sampled] = trains(np.asarray(versions)[sampled], min_version, stale_tokens)
    return mask


def _trained(group: list[Trajectory], min_version: int, stale_tokens: str):
    """(sampled versions, which train) of each scored episode of `group`."""
    for e in group:
        if e.infra_error is None:
            versions = sampled_versions([e])
            yield versions, trains(versions, min_version, stale_tokens)


def trainable(group: list[Trajectory], min_version: int, stale_tokens: str = "drop") -> bool:
    """Whether any sampled token of `group` trains (see `trains`)."""
    return any(t.any() for _, t in _trained(group, min_version, stale_tokens))


def staleness_stats(
    groups: list[list[Trajectory]], trained: list[bool], version: int, k: int, stale_tokens: str = "drop"
) -> dict[str, Any]:
    """Staleness of the trained groups' sampled tokens behind the trainer's `version`: of those that
    train (`trains`), the mean and max lag and the fraction at each lag 0..k; the fraction that
    does not train (`staleness_masked_frac`), and the trained groups' scored trajectories of which
    nothing trains (`trajectories_stale`: typically the quick episodes of a group that waited for
    a straggler)."""
    trained_lags, untrained, total, stale = [np.zeros(0, np.int64)], 0, 0, 0
    for g in (g for g, keep in zip(groups, trained, strict=True) if keep):
        for versions, t in _trained(g, version - k, stale_tokens):
            trained_lags.append(version - versions[t])
            untrained, total, stale = untrained + int((~t).sum()), total + t.size, stale + (not t.any())
    lags = np.concatenate(trained_lags)
    out: dict[str, Any] = {
        "staleness_mean": float(lags.mean()) if lags.size else 0.0,
        "staleness_max": int(lags.max()) if lags.size else 0,
        "staleness_masked_frac": untrained / total if total else 0.0,
        "trajectories_stale": stale,
    }
    for lag in range(k + 1):
        out[f"staleness_frac_{lag}"] = float((lags == lag).mean()) if lags.size else 0.0
    return out


def first_trained(candidates: list[bool], limit: int) -> list[bool]:
    """DAPO's dynamic sampling trains on at most `limit` of the `candidates` (the first ones)."""
    first = set([i for i, c in enumerate(candidates) if c][:limit])
    return [i in first for i in range(len(candidates))]


@dataclass
class Scored:
    """An iteration's groups in draw order, scored: shaped rewards, advantages, which groups train
    (`trained`), the oldest fresh policy version (k > 0; None: every token is fresh) and the
    staleness metrics (k > 0)."""

    groups: list[list[Trajectory]]
    rewards: list[list[float]]
    result: GroupResult
    trained: list[bool]
    min_version: int | None = None
    staleness: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scorer:
    """Scores the groups of an iteration (`score`) with the run's reward, advantage and staleness
    settings; `candidate` says of one group as it arrives whether it may train."""

    threshold: int  # rl.turn_penalty_threshold
    max_turns: int  # agent.max_turns
    limit: int  # rl.problems_per_iteration: the most groups that train
    k: int  # rl.max_staleness
    stale_tokens: str = "drop"
    scale_by_std: bool = True

    @classmethod
    def from_config(cls, cfg: RunConfig) -> Scorer:
        """The scorer of a run's settings."""
        rl = cfg.rl
        return cls(
            threshold=rl.turn_penalty_threshold,
            max_turns=cfg.agent.max_turns,
            limit=rl.problems_per_iteration,
            k=rl.max_staleness,
            stale_tokens=rl.stale_tokens,
            scale_by_std=rl.advantage_std,
        )

    def rewards(self, group: list[Trajectory]) -> list[float]:
        """Shaped rewards (outcome + turn penalty) of one group's episodes."""
        resolved = np.array([e.resolved for e in group])
        turns = np.array([e.num_turns for e in group])
        return shaped_rewards(resolved, turns, threshold=self.threshold, max_turns=self.max_turns).tolist()

    def candidate(self, group: list[Trajectory], version: int) -> bool:
        """Whether `group` may train when the trainer holds policy `version`: informative, and at
        k > 0 some token of it trains (raises when its tokens carry no version)."""
        compares = informative(self.rewards(group), [e.infra_error is not None for e in group])
        if not self.k:
            return compares
        check_versioned(group)
        return compares and trainable(group, version - self.k, self.stale_tokens)

    def score(self, groups: list[list[Trajectory]], version: int) -> Scored:
        """`groups` (in draw order) scored for the trainer at policy `version`: of the informative
        ones with a token that trains, the first `limit` train."""
        rewards = [self.rewards(g) for g in groups]
        result = judge(groups, rewards, self.scale_by_std)
        if not self.k:
            return Scored(groups, rewards, result, first_trained(result.informative, self.limit))
        min_version = version - self.k
        fresh = [trainable(g, min_version, self.stale_tokens) for g in groups]
        candidates = [a and b for a, b in zip(result.informative, fresh, strict=True)]
        trained = first_trained(candidates, self.limit)
        stats = staleness_stats(groups, trained, version, self.k, self.stale_tokens)
        staleness = {"groups_stale": len(fresh) - sum(fresh), **stats}
        return Scored(groups, rewards, result, trained, min_version, staleness)
