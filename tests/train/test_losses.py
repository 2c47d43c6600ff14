"""Losses against float64 NumPy references, analytic gradients and micro-batch invariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxswe import losses


def _np_dapo(logp, old, adv, mask, eps_low, eps_high, num_tokens=None):
    logp, old, adv, mask = (np.asarray(a, np.float64) for a in (logp, old, adv, mask))
    adv_bt = adv[:, None] if adv.ndim == 1 else adv
    ratio = np.exp(logp - old)
    obj = np.minimum(ratio * adv_bt, np.clip(ratio, 1 - eps_low, 1 + eps_high) * adv_bt)
    n = mask.sum() if num_tokens is None else num_tokens
    return -(mask * obj).sum() / max(n, 1.0)


def _inputs(seed, b=4, t=16, scale=0.5):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 1.0, (b, t)).astype(np.float32)
    logp = (old + rng.normal(0.0, scale, (b, t))).astype(np.float32)
    adv = rng.normal(0.0, 1.0, (b,)).astype(np.float32)
    mask = (rng.random((b, t)) < 0.7).astype(np.float32)
    return logp, old, adv, mask


def _maybe_jit(fn, jit):
    return jax.jit(fn) if jit else fn


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dapo_loss_matches_numpy(jit, seed):
    logp, old, adv, mask = _inputs(seed)
    fn = _maybe_jit(lambda *a: losses.dapo_loss(*a, eps_low=0.2, eps_high=0.28), jit)
    loss, aux = fn(logp, old, adv, mask)
    np.testing.assert_allclose(loss, _np_dapo(logp, old, adv, mask, 0.2, 0.28), rtol=1e-5)
    ratio = np.exp(logp.astype(np.float64) - old)
    on = mask > 0
    np.testing.assert_allclose(aux["ratio_mean"], ratio[on].mean(), rtol=1e-5)
    np.testing.assert_allclose(aux["approx_kl"], (ratio - 1 - np.log(ratio))[on].mean(), rtol=1e-4, atol=1e-7)
    clipped = ((adv[:, None] > 0) & (ratio > 1.28)) | ((adv[:, None] < 0) & (ratio < 0.8))
    np.testing.assert_allclose(aux["clip_fraction"], clipped[on].mean(), rtol=1e-6)
    assert float(aux["num_tokens"]) == mask.sum()


def test_dapo_loss_per_token_advantages_equal_broadcast():
    logp, old, adv, mask = _inputs(3)
    per_traj, _ = losses.dapo_loss(logp, old, adv, mask)
    per_tok, _ = losses.dapo_loss(logp, old, np.broadcast_to(adv[:, None], logp.shape), mask)
    np.testing.assert_allclose(per_tok, per_traj, rtol=1e-6)
    adv_bt = np.random.default_rng(0).normal(size=logp.shape).astype(np.float32)
    loss, _ = losses.dapo_loss(logp, old, adv_bt, mask)
    np.testing.assert_allclose(loss, _np_dapo(logp, old, adv_bt, mask, 0.2, 0.28), rtol=1e-5)


def test_dapo_loss_given_num_tokens_and_weights():
    logp, old, adv, mask = _inputs(4)
    loss, _ = losses.dapo_loss(logp, old, adv, mask, num_tokens=1000.0)
    np.testing.assert_allclose(loss, _np_dapo(logp, old, adv, mask, 0.2, 0.28, 1000.0), rtol=1e-5)
    weights = np.full_like(mask, 0.5)
    half, _ = losses.dapo_loss(logp, old, adv, mask, token_weights=weights)
    full, _ = losses.dapo_loss(logp, old, adv, mask)
    np.testing.assert_allclose(half, 0.5 * full, rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_dapo_loss_entropy_bonus_matches_numpy(jit):
    logp, old, adv, mask = _inputs(5)
    entropy = np.random.default_rng(5).uniform(0.0, 3.0, logp.shape).astype(np.float32)
    fn = _maybe_jit(
        lambda *a, ent: losses.dapo_loss(*a, num_tokens=40.0, entropy=ent, entropy_coef=0.05), jit
    )
    loss, _ = fn(logp, old, adv, mask, ent=entropy)
    want = _np_dapo(logp, old, adv, mask, 0.2, 0.28, 40.0) - 0.05 * (mask * entropy).sum() / 40.0
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    off, _ = losses.dapo_loss(logp, old, adv, mask, entropy=entropy)  # entropy_coef 0: plain DAPO
    np.testing.assert_allclose(off, _np_dapo(logp, old, adv, mask, 0.2, 0.28), rtol=1e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_dapo_gradient_is_analytic(jit):
    """d loss / d logp = -mask * A * rho / N where the unclipped term is the min, else 0."""
    logp, old, adv, mask = _inputs(5, scale=0.6)
    eps_low, eps_high = 0.2, 0.3
    grad_fn = _maybe_jit(
        jax.grad(lambda lp: losses.dapo_loss(lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)[0]), jit
    )
    grad = np.asarray(grad_fn(logp), np.float64)
    ratio = np.exp(logp.astype(np.float64) - old)
    a = adv[:, None].astype(np.float64)
    binds = ((a > 0) & (ratio > 1 + eps_high)) | ((a < 0) & (ratio < 1 - eps_low))
    expected = np.where(binds, 0.0, -mask * a * ratio / mask.sum())
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-9)
    assert np.all(grad[mask == 0] == 0.0)
    assert np.all(grad[binds & (mask > 0)] == 0.0)
    assert binds[mask > 0].any() and (~binds[mask > 0]).any()  # both cases exercised


def test_micro_batch_invariance():
    logp, old, _, mask = _inputs(6, b=8, t=12)
    adv = np.random.default_rng(6).normal(size=(8,)).astype(np.float32)
    n_global = mask.sum()

    def full(lp):
        return losses.dapo_loss(lp, old, adv, mask)[0]

    def split(lp):
        total = 0.0
        for i in range(4):
            s = slice(2 * i, 2 * i + 2)
            total = total + losses.dapo_loss(lp[s], old[s], adv[s], mask[s], num_tokens=n_global)[0]
        return total

    np.testing.assert_allclose(split(logp), full(logp), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(split)(logp), jax.grad(full)(logp), rtol=1e-6, atol=1e-9)
    sft_full = losses.sft_loss(logp, mask)[0]
    sft_split = sum(losses.sft_loss(logp[i::4], mask[i::4], num_tokens=n_global)[0] for i in range(4))
    np.testing.assert_allclose(sft_split, sft_full, rtol=1e-6)


@pytest.mark.parametrize("diff", [50.0, -50.0])
def test_dapo_extreme_log_ratios_are_finite(diff):
    logp, old, adv, mask = _inputs(7)
    logp = old + diff
    loss, aux = losses.dapo_loss(logp, old, adv, mask)
    grads = jax.grad(lambda lp: losses.dapo_loss(lp, old, adv, mask)[0])(logp)
    assert np.isfinite(loss) and all(np.isfinite(v) for v in aux.values())
    assert np.all(np.isfinite(grads))


def test_all_masked_batch_gives_zero_not_nan():
    logp, old, adv, _ = _inputs(8)
    mask = np.zeros_like(logp)
    old = old.copy()
    old[0, 0] = -np.inf  # garbage under the mask must not leak
    loss, aux = losses.dapo_loss(logp, old, adv, mask)
    assert float(loss) == 0.0 and all(np.isfinite(v) for v in aux.values())
    grads = jax.grad(lambda lp: losses.dapo_loss(lp, old, adv, mask)[0])(logp)
    assert np.all(grads == 0.0)
    sft, sft_aux = losses.sft_loss(logp, mask)
    assert float(sft) == 0.0 and np.isfinite(sft_aux["nll"])


@pytest.mark.parametrize("jit", [False, True])
def test_sft_loss_matches_numpy(jit):
    logp, _, _, mask = _inputs(9)
    fn = _maybe_jit(losses.sft_loss, jit)
    loss, aux = fn(logp, mask)
    ref = -(mask.astype(np.float64) * logp).sum() / mask.sum()
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    np.testing.assert_allclose(aux["nll"], ref, rtol=1e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_group_advantages_match_numpy(jit):
    rng = np.random.default_rng(10)
    rewards = rng.integers(0, 2, (6, 10)).astype(np.float32) + rng.normal(0, 0.1, (6, 10)).astype(np.float32)
    fn = _maybe_jit(losses.group_advantages, jit)
    adv = fn(rewards)
    r = rewards.astype(np.float64)
    ref = (r - r.mean(-1, keepdims=True)) / (r.std(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-6)


def test_equal_groups_give_exactly_zero():
    rewards = jnp.array([[0.1] * 10, [1.0] * 10, [-0.3] * 10, [0.0] * 9 + [1.0]], jnp.float32)
    adv = np.asarray(losses.group_advantages(rewards))
    assert np.all(adv[:3] == 0.0)
    assert adv[3, -1] > 0 and np.all(adv[3, :-1] < 0)
    np.testing.assert_array_equal(losses.informative_groups(rewards), [False, False, False, True])


def test_informative_groups_selects_mixed():
    rewards = np.array([[0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 0, 1]], np.float32)
    np.testing.assert_array_equal(jax.jit(losses.informative_groups)(rewards), [False, False, True, True])


@pytest.mark.parametrize(
    ("n", "t_max", "expected"),
    [
        (0, 40, 0.0),
        (9, 40, 0.0),
        (10, 40, 0.0),
        (11, 40, -1 / 30),
        (25, 40, -15 / 30),
        (40, 40, -1.0),
        (9, 80, 0.0),
        (10, 80, 0.0),
        (45, 80, -35 / 70),
        (80, 80, -1.0),
    ],
)
def test_turn_penalty_matches_paper(n, t_max, expected):
    np.testing.assert_allclose(losses.turn_penalty(n, threshold=10, max_turns=t_max), expected, rtol=1e-6)


def test_turn_penalty_on_arrays_and_jit():
    n = jnp.array([5, 10, 20, 40])
    out = jax.jit(lambda x: losses.turn_penalty(x, threshold=10, max_turns=40))(n)
    np.testing.assert_allclose(out, [0.0, 0.0, -1 / 3, -1.0], rtol=1e-6)
    with pytest.raises(ValueError):
        losses.turn_penalty(5, threshold=10, max_turns=10)


def test_shape_errors_are_caught():
    logp, old, adv, mask = _inputs(11)
    with pytest.raises(AssertionError):
        losses.dapo_loss(logp, old[:, :-1], adv, mask)
    with pytest.raises(AssertionError):
        losses.dapo_loss(logp, old, adv[:-1], mask)


def _np_off_policy(old, rollout, mask, seg, cap, mode, threshold):
    """float64 reference of off_policy_weights: per-token capped ratio times a per-segment mask."""
    old, rollout, mask = (np.asarray(a, np.float64) for a in (old, rollout, mask))
    d = np.where(mask > 0, old - rollout, 0.0)
    w = np.exp(d) if cap is None else np.minimum(np.exp(d), cap)
    keep = np.ones_like(w, bool)
    if mode != "none":
        for r in range(seg.shape[0]):
            for s in set(seg[r].tolist()):
                span = seg[r] == s
                stat = d[r, span].sum()
                if mode == "geometric":
                    stat /= max((mask[r, span] > 0).sum(), 1)
                keep[r, span] = abs(stat) <= np.log(threshold)
    w = np.where((mask > 0) & keep, w if cap is not None else 1.0, 0.0)
    return w, keep


@pytest.mark.parametrize(
    "mode, cap",
    [("none", 1.5), ("sequence", None), ("sequence", 1.5), ("geometric", None), ("geometric", 1.5)],
)
def test_off_policy_weights_match_numpy(mode, cap):
    """Token TIS and sequence/geometric-mean masking per packed segment, jitted, vs float64."""
    rng = np.random.default_rng(7)
    b, t = 3, 12
    seg = np.zeros((b, t), np.int32)
    seg[:, :5], seg[:, 5:10] = 1, 2  # two trajectories per row, padding after
    mask = ((rng.random((b, t)) > 0.2) & (seg > 0)).astype(np.float32)
    rollout = -rng.uniform(0.5, 3.0, (b, t)).astype(np.float32)
    old = (rollout + rng.normal(0, 0.4, (b, t))).astype(np.float32)
    old[0, :5] += 1.0  # one trajectory far off-policy
    fn = jax.jit(
        lambda *a: losses.off_policy_weights(*a, tis_cap=cap, sequence_mask=mode, mask_threshold=1.6)
    )
    w, aux = fn(old, rollout, mask, seg)
    want, keep = _np_off_policy(old, rollout, mask, seg, cap, mode, 1.6)
    np.testing.assert_allclose(np.asarray(w), want, rtol=1e-5, atol=1e-6)
    on = mask > 0
    np.testing.assert_allclose(float(aux["offpolicy_masked_fraction"]), (~keep)[on].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(aux["offpolicy_weight_max"]), want[on].max(), rtol=1e-5)
    if mode != "none":
        assert 0 < (~keep)[on].mean() < 1  # the threshold masks some trajectories, not all
