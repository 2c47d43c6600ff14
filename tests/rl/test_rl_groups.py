"""Scoring an RL iteration's groups (jaxswe.rl.groups) on plain trajectories, no stage and no
model: shaped rewards, group advantages, which groups train (informative, fresh, the first P) and
which tokens, against numbers worked out by hand."""

import numpy as np
import pytest

from jaxswe.agent.trajectory import Trajectory, Turn
from jaxswe.errors import UserError
from jaxswe.rl.groups import Scorer, advantage_stats, compute_group_advantages, shaped_rewards, trained_tokens


def _episode(resolved: bool, versions: list[int], turns: int = 1, infra: bool = False) -> Trajectory:
    """An episode of `turns` turns whose sampled tokens are those with a policy version."""
    n = len(versions)
    return Trajectory(
        task_id="t",
        input_ids=list(range(n)),
        loss_mask=[int(v >= 0) for v in versions],
        rollout_logprobs=[0.0] * n,
        policy_versions=versions,
        turns=[Turn(0, n)] * turns,
        reward=float(resolved),
        infra_error="sandbox died" if infra else None,
    )


def test_shaped_rewards_turn_penalty():
    r = shaped_rewards(np.array([1, 1, 0, 0]), np.array([3, 10, 25, 40]), threshold=10, max_turns=40)
    np.testing.assert_allclose(r, [1.0, 1.0, -0.5, -1.0])


def test_group_advantages_drop_and_exclude():
    rewards = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    infra = [[False] * 4, [False] * 4, [False, False, True, True], [False, True, True, True]]
    res = compute_group_advantages(rewards, infra)
    assert res.informative == [True, False, True, False]
    assert res.infra_failures == 5
    np.testing.assert_allclose(res.advantages[0], [1, -1, -1, 1], atol=1e-5)
    # excluded members get 0 and do not enter the mean/std
    np.testing.assert_allclose(res.advantages[2], [-1, 1, 0, 0], atol=1e-5)
    assert res.advantages[1] == [0.0] * 4 and res.advantages[3] == [0.0] * 4
    g = np.array([1.0, 0, 0, 1])
    ref = (g - g.mean()) / (g.std() + 1e-6)
    np.testing.assert_allclose(res.advantages[0], ref, rtol=1e-5)
    st = advantage_stats(res, res.informative)
    assert st["adv_max"] == pytest.approx(1, abs=1e-5) and st["adv_min"] == pytest.approx(-1, abs=1e-5)
    # only the groups that train count (dynamic sampling's limit, the staleness bound)
    assert advantage_stats(res, [False, False, True, False])["adv_mean"] == pytest.approx(0, abs=1e-6)
    zeros = dict.fromkeys(("adv_mean", "adv_std", "adv_min", "adv_max"), 0.0)
    assert advantage_stats(res, [False] * 4) == zeros


def test_mismatched_input():
    with pytest.raises(ValueError):
        compute_group_advantages([[1.0, 0.0]], [[False]])


def test_synchronous_scoring_trains_the_first_informative_groups():
    """k = 0, P = 1, turn penalty from 2 of at most 4 turns: an all-solved group does not compare,
    a 1-turn win against a 3-turn loss does (rewards 1 and -0.5: advantages +-1, or +-0.75
    centred only), and of two informative groups only the first drawn trains."""
    groups = [
        [_episode(True, [-1, 0]), _episode(True, [-1, 0])],
        [_episode(True, [-1, 0]), _episode(False, [-1, 0], turns=3)],
        [_episode(True, [-1, 0]), _episode(False, [-1, 0]), _episode(False, [-1, 0], infra=True)],
    ]
    scorer = Scorer(threshold=2, max_turns=4, limit=1, k=0)
    scored = scorer.score(groups, version=0)
    assert scored.rewards[1] == [1.0, -0.5] and scored.rewards[0] == [1.0, 1.0]
    assert scored.result.informative == [False, True, True] and scored.trained == [False, True, False]
    np.testing.assert_allclose(scored.result.advantages[1], [1, -1], atol=1e-5)
    np.testing.assert_allclose(scored.result.advantages[2], [1, -1, 0], atol=1e-5)
    assert scored.result.infra_failures == 1 and scored.min_version is None and scored.staleness == {}
    assert [scorer.candidate(g, 0) for g in groups] == [False, True, True]
    centred = Scorer(threshold=2, max_turns=4, limit=1, k=0, scale_by_std=False).score(groups, 0)
    np.testing.assert_allclose(centred.result.advantages[1], [0.75, -0.75], rtol=1e-6)
    assert centred.trained == scored.trained


def test_async_scoring_leaves_out_stale_groups_and_measures_the_trained_tokens():
    """k = 1 with the trainer at version 3 (oldest fresh version 2): a group of only version-0 and
    -1 tokens cannot train, and P = 2 of the other two do; the staleness metrics describe the
    trained groups' tokens (lags 0, 0, 1 and 0, 1; one stale token masked of 6)."""
    fresh = [_episode(True, [-1, 3, 3]), _episode(False, [-1, 2])]
    stale = [_episode(True, [-1, 1]), _episode(False, [-1, 0, 1])]
    mixed = [_episode(True, [-1, 1, 3]), _episode(False, [-1, 2])]
    scorer = Scorer(threshold=10, max_turns=40, limit=2, k=1)
    scored = scorer.score([fresh, stale, mixed], version=3)
    assert scored.result.informative == [True, True, True] and scored.trained == [True, False, True]
    assert scored.min_version == 2 and [scorer.candidate(g, 3) for g in (fresh, stale, mixed)] == [
        True,
        False,
        True,
    ]
    assert scored.staleness == {
        "groups_stale": 1,
        "staleness_mean": pytest.approx(2 / 5),
        "staleness_max": 1,
        "staleness_masked_frac": pytest.approx(1 / 6),
        "trajectories_stale": 0,
        "staleness_frac_0": pytest.approx(3 / 5),
        "staleness_frac_1": pytest.approx(2 / 5),
    }
    assert Scorer(threshold=10, max_turns=40, limit=1, k=1).score([fresh, stale, mixed], 3).trained == [
        True,
        False,
        False,
    ]
    unversioned = _episode(False, [-1, -1])
    unversioned.loss_mask = [0, 1]  # sampled, but the engine reported no version
    with pytest.raises(UserError, match="weight_version"):
        scorer.candidate([_episode(True, [-1, 3]), unversioned], 3)


@pytest.mark.parametrize(
    ("stale_tokens", "want"),
    [("drop", [0, 0, 1, 0, 1]), ("trajectory", [0, 0, 0, 0, 0]), ("keep", [0, 1, 1, 0, 1])],
)
def test_trained_tokens_follow_the_stale_token_rule(stale_tokens, want):
    """Sampled tokens of versions 1, 2, 4 with oldest fresh version 2; unsampled tokens never train."""
    mask = trained_tokens(np.array([0, 1, 1, 0, 1]), np.array([-1, 1, 2, -1, 4]), 2, stale_tokens)
    assert mask.astype(int).tolist() == want
