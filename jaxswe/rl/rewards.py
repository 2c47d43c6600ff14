"""The reward arithmetic of one RL iteration: rewards -> advantages -> kept groups.

Pure functions over plain arrays, one group per problem. Infra failures (sandbox died, server
error) are excluded from their group's statistics and never scored 0; a group with fewer than two
scored members carries no comparison and is dropped, as is a group whose rewards are all equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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

    advantages: list[list[float]]  # 0.0 for excluded or dropped members
    kept: list[bool]  # per group: contributes to training
    infra_failures: int

    @property
    def groups_kept(self) -> int:
        return sum(self.kept)


def compute_group_advantages(
    rewards: list[list[float]], infra_failed: list[list[bool]], *, scale_by_std: bool = True
) -> GroupResult:
    """Group-normalized advantages over the scored members of each group (`group_advantages`;
    without `scale_by_std`, mean-centred only)."""
    if len(rewards) != len(infra_failed):
        raise ValueError("rewards and infra_failed must list the same groups")
    advantages: list[list[float]] = []
    kept: list[bool] = []
    failures = 0
    for r_g, bad_g in zip(rewards, infra_failed, strict=True):
        if len(r_g) != len(bad_g):
            raise ValueError("each group needs one infra flag per reward")
        failures += sum(bad_g)
        scored = [i for i, bad in enumerate(bad_g) if not bad]
        adv = [0.0] * len(r_g)
        if len(scored) >= 2:
            r_1g = np.asarray([[r_g[i] for i in scored]], np.float32)
            a_1g = np.asarray(group_advantages(r_1g, scale_by_std=scale_by_std))[0]
            for i, a in zip(scored, a_1g, strict=True):
                adv[i] = float(a)
        keep = len(scored) >= 2 and len({float(r_g[i]) for i in scored}) > 1
        advantages.append(adv if keep else [0.0] * len(r_g))
        kept.append(keep)
    return GroupResult(advantages=advantages, kept=kept, infra_failures=failures)


def advantage_stats(result: GroupResult, trained: list[bool]) -> dict[str, float]:
    """Mean, std, min, max of the advantages that reach the loss: those of the `trained` groups
    (informative, and chosen by dynamic sampling's limit and the staleness bound)."""
    a = np.array([x for adv, t in zip(result.advantages, trained, strict=True) if t for x in adv])
    if a.size == 0:
        return {"adv_mean": 0.0, "adv_std": 0.0, "adv_min": 0.0, "adv_max": 0.0}
    return {
        "adv_mean": float(a.mean()),
        "adv_std": float(a.std()),
        "adv_min": float(a.min()),
        "adv_max": float(a.max()),
    }
