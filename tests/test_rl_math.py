import numpy as np
import pytest

from jaxswe.rl.rewards import advantage_stats, compute_group_advantages, shaped_rewards


def test_shaped_rewards_turn_penalty():
    r = shaped_rewards(np.array([1, 1, 0, 0]), np.array([3, 10, 25, 40]), threshold=10, max_turns=40)
    np.testing.assert_allclose(r, [1.0, 1.0, -0.5, -1.0])


def test_group_advantages_drop_and_exclude():
    rewards = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    infra = [[False] * 4, [False] * 4, [False, False, True, True], [False, True, True, True]]
    res = compute_group_advantages(rewards, infra)
    assert res.kept == [True, False, True, False]
    assert res.infra_failures == 5
    np.testing.assert_allclose(res.advantages[0], [1, -1, -1, 1], atol=1e-5)
    # excluded members get 0 and do not enter the mean/std
    np.testing.assert_allclose(res.advantages[2], [-1, 1, 0, 0], atol=1e-5)
    assert res.advantages[1] == [0.0] * 4 and res.advantages[3] == [0.0] * 4
    g = np.array([1.0, 0, 0, 1])
    ref = (g - g.mean()) / (g.std() + 1e-6)
    np.testing.assert_allclose(res.advantages[0], ref, rtol=1e-5)
    st = advantage_stats(res, res.kept)
    assert st["adv_max"] == pytest.approx(1, abs=1e-5) and st["adv_min"] == pytest.approx(-1, abs=1e-5)
    # only the groups that train count (dynamic sampling's limit, the staleness bound)
    assert advantage_stats(res, [False, False, True, False])["adv_mean"] == pytest.approx(0, abs=1e-6)
    zeros = dict.fromkeys(("adv_mean", "adv_std", "adv_min", "adv_max"), 0.0)
    assert advantage_stats(res, [False] * 4) == zeros


def test_mismatched_input():
    with pytest.raises(ValueError):
        compute_group_advantages([[1.0, 0.0]], [[False]])
