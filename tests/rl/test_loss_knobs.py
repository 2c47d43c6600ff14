"""The negative-side knobs of the RL loss (rl.negative_weight, rl.negative_prob_floor,
rl.advantage_std, rl.mask_format_errors), the RL stage's lr warm-up and its optimizer-steps
warning: each against a float64 NumPy reference of its loss and gradient, jitted and not; at their
defaults the loss and gradient are exactly DAPO's."""

import jax
import numpy as np
import pytest

from jaxswe import losses
from jaxswe.agent.trajectory import Trajectory, Turn
from jaxswe.config import RLSection, RunConfig
from jaxswe.rl.groups import Scored, compute_group_advantages
from jaxswe.rl.train import StepsWarning, training_sequences

EPS_LOW, EPS_HIGH = 0.2, 0.28


def _reference(logp, old, adv, mask, *, negative_weight=1.0, floor=0.0, num_tokens=None):
    """(loss, d loss / d logp) in float64, written from the objective's definition: each token's
    min(rho A, clip(rho) A) times its negative-side weight; the gradient is -w A rho / N where the
    clip does not bind, else 0."""
    logp, old, adv, mask = (np.asarray(x, np.float64) for x in (logp, old, adv, mask))
    a = adv[:, None] if adv.ndim == 1 else adv
    ratio = np.exp(logp - old)
    side = np.where(a < 0, np.where(np.exp(logp) >= floor, negative_weight, 0.0), 1.0)
    objective = np.minimum(ratio * a, np.clip(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * a)
    n = max(mask.sum() if num_tokens is None else num_tokens, 1.0)
    binds = ((a > 0) & (ratio > 1 + EPS_HIGH)) | ((a < 0) & (ratio < 1 - EPS_LOW))
    grad = np.where(binds, 0.0, -mask * side * a * ratio / n)
    return -(mask * side * objective).sum() / n, grad


def _inputs(seed, b=6, t=20):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 1.0, (b, t)).astype(np.float32)
    logp = (old + rng.normal(0.0, 0.5, (b, t))).astype(np.float32)
    adv = rng.normal(0.0, 1.0, (b,)).astype(np.float32)
    mask = (rng.random((b, t)) < 0.8).astype(np.float32)
    assert (adv > 0).any() and (adv < 0).any()
    return logp, old, adv, mask


def _loss_and_grad(old, adv, mask, jit, **knobs):
    def loss(lp):
        return losses.dapo_loss(lp, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, **knobs)

    fn = jax.value_and_grad(loss, has_aux=True)
    return jax.jit(fn) if jit else fn


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("weight, floor", [(0.0, 0.0), (0.25, 0.0), (1.0, 0.1), (0.25, 0.1)])
def test_negative_weight_and_probability_floor_match_float64(jit, weight, floor):
    logp, old, adv, mask = _inputs(0)
    knobs = {"negative_weight": weight, "negative_prob_floor": floor}
    (loss, aux), grad = _loss_and_grad(old, adv, mask, jit, **knobs)(logp)
    want_loss, want_grad = _reference(logp, old, adv, mask, negative_weight=weight, floor=floor)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-9)
    negative = (adv[:, None] < 0) & (mask > 0)
    below = negative & (np.exp(logp.astype(np.float64)) < floor)
    if floor:
        assert below.any() and (negative & ~below).any()  # both sides of the floor exercised
        np.testing.assert_allclose(aux["prob_floor_fraction"], below.sum() / mask.sum(), rtol=1e-6)
        assert np.all(np.asarray(grad)[below] == 0.0)  # no push-down below the floor
    else:
        assert "prob_floor_fraction" not in aux
    if weight == 0.0:
        assert np.all(np.asarray(grad)[negative] == 0.0)


@pytest.mark.parametrize("jit", [False, True])
def test_defaults_give_exactly_dapo(jit):
    """At their defaults the knobs leave the loss, the gradient and the advantages bit for bit as
    without them; the config's defaults are those defaults."""
    logp, old, adv, mask = _inputs(1)
    (plain, _), plain_grad = _loss_and_grad(old, adv, mask, jit)(logp)
    (knobs, _), knobs_grad = _loss_and_grad(
        old, adv, mask, jit, negative_weight=1.0, negative_prob_floor=0.0
    )(logp)
    np.testing.assert_array_equal(knobs, plain)
    np.testing.assert_array_equal(knobs_grad, plain_grad)
    rewards = np.random.default_rng(1).integers(0, 2, (5, 8)).astype(np.float32)
    group = (
        jax.jit(losses.group_advantages, static_argnames="scale_by_std") if jit else losses.group_advantages
    )
    np.testing.assert_array_equal(group(rewards, scale_by_std=True), group(rewards))
    assert losses.LossSettings.from_rl(RLSection()) == losses.LossSettings()
    rl = RLSection()
    assert (rl.advantage_std, rl.mask_format_errors, rl.warmup_steps) == (True, "never", None)


@pytest.mark.parametrize("jit", [False, True])
def test_advantages_without_std_division_match_float64(jit):
    """rl.advantage_std false (Dr. GRPO): A = r - mean over the group, and the loss and gradient
    with those advantages; in the RL arithmetic the mean skips infrastructure failures."""
    rng = np.random.default_rng(2)
    rewards = (rng.integers(0, 2, (6, 8)) - 0.1 * rng.integers(0, 3, (6, 8))).astype(np.float32)
    rewards[0] = 1.0  # an uninformative group: exactly 0
    rewards[1] = [1, 1, 1, 1, 1, 1, 1, 0]  # 7 of 8: the lone failure gets -0.875, not -2.65
    centred = lambda r: losses.group_advantages(r, scale_by_std=False)  # noqa: E731
    adv = np.asarray((jax.jit(centred) if jit else centred)(rewards))
    r = rewards.astype(np.float64)
    want = r - r.mean(-1, keepdims=True)
    np.testing.assert_allclose(adv, want, rtol=1e-6, atol=1e-7)
    assert np.all(adv[0] == 0.0) and adv[1, -1] == pytest.approx(-0.875)

    logp, old, _, mask = _inputs(2, b=8)
    per_episode = adv[1].astype(np.float32)
    (loss, _), grad = _loss_and_grad(old, per_episode, mask, jit)(logp)
    want_loss, want_grad = _reference(logp, old, per_episode, mask)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-9)

    result = compute_group_advantages(
        [[1.0, 0.0, 0.0, 1.0]], [[False, False, False, True]], scale_by_std=False
    )
    np.testing.assert_allclose(result.advantages[0], [2 / 3, -1 / 3, -1 / 3, 0.0], rtol=1e-6)


def _episode(resolved: bool, format_error_turn: int | None) -> Trajectory:
    """A 3-turn episode: a 4-token prompt, then per turn 3 sampled tokens and a 2-token observation."""
    ids, mask, turns = list(range(4)), [0] * 4, []
    for k in range(3):
        turns.append(Turn(len(ids), len(ids) + 3, format_error=k == format_error_turn))
        ids += [10 + k] * 3 + [50, 51]
        mask += [1, 1, 1, 0, 0]
    logprobs = [-0.5 * m for m in mask]
    versions = [0 if m else -1 for m in mask]
    return Trajectory(
        task_id="t", input_ids=ids, loss_mask=mask, rollout_logprobs=logprobs, policy_versions=versions,
        turns=turns, ended_by="submitted", reward=float(resolved),
    )  # fmt: skip


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("mode", ["never", "positive", "always"])
def test_format_error_turns_leave_the_loss_as_configured(jit, mode):
    """rl.mask_format_errors: a success and a failure, each with a format error in turn 2. Their
    trained masks are RFT's where the mode says, and the loss and gradient over them (N = the
    tokens left) match float64."""
    groups = [[_episode(True, 1), _episode(False, 1)]]
    rewards = [[1.0, 0.0]]
    result = compute_group_advantages(rewards, [[False, False]])
    c = Scored(groups, rewards, result, trained=[True])
    seqs, dropped = training_sequences(c, mask_format_errors=mode)
    assert not dropped and [s.advantage for s in seqs] == pytest.approx([1.0, -1.0], rel=1e-5)
    sampled = np.array(groups[0][0].loss_mask, np.float32)
    error_turn = np.zeros_like(sampled)
    error_turn[groups[0][0].turns[1].start : groups[0][0].turns[1].end] = 1
    out = {"never": (False, False), "positive": (True, False), "always": (True, True)}[mode]
    want_masks = [sampled * (1 - error_turn) if masked else sampled for masked in out]
    for seq, want in zip(seqs, want_masks, strict=True):
        np.testing.assert_array_equal(seq.loss_mask, want)

    mask = np.stack([s.loss_mask for s in seqs])
    adv = np.array([s.advantage for s in seqs], np.float32)
    rng = np.random.default_rng(3)
    old = rng.normal(-1.0, 0.5, mask.shape).astype(np.float32)
    logp = (old + rng.normal(0.0, 0.3, mask.shape)).astype(np.float32)
    (loss, aux), grad = _loss_and_grad(old, adv, mask, jit)(logp)
    want_loss, want_grad = _reference(logp, old, adv, np.stack(want_masks))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-9)
    assert float(aux["num_tokens"]) == sum(m.sum() for m in want_masks)


def test_steps_warning_once_per_stage_above_the_bound():
    warn = StepsWarning(RLSection())  # the paper's 2 to 8
    assert warn(8) is None and warn(0) is None
    line = warn(24)
    assert line.startswith("jaxswe: WARNING: an RL iteration took 24 optimizer steps") and "(8;" in line
    assert warn(30) is None  # once per stage
    assert StepsWarning(RLSection(max_optimizer_steps=None))(1000) is None


@pytest.mark.slow
def test_rl_trainer_takes_the_warmup_and_the_negative_weight():
    """The RL stage's Trainer: rl.warmup_steps sets its lr schedule (0, lr/2, lr over 2 steps) and
    rl.negative_weight 0 reaches the jitted loss (failures only: loss and gradient exactly 0,
    where DAPO's would push every token down)."""
    from jaxswe.model import get_preset, init_params
    from jaxswe.packing import Sequence, pack_sequences
    from jaxswe.policy import Policy
    from jaxswe.rl.loop import rl_trainer

    model = get_preset("tiny", vocab_size=64, num_layers=1, attention="dense")
    cfg = RunConfig.model_validate(
        {
            "optimizer": {"lr": 1e-3, "warmup_steps": 0},
            "mesh": {"devices": 1},
            "rl": {"warmup_steps": 2, "negative_weight": 0.0, "seq_len": 32},
        }
    )
    trainer = rl_trainer(cfg, Policy(model, init_params(model, jax.random.key(0)), ""))
    ids = np.arange(20, dtype=np.int32) % 64
    mask = (np.arange(20) >= 8).astype(np.float32)
    seqs = [
        Sequence(ids, mask, -mask, advantage=-1.0),
        Sequence(ids[::-1].copy(), mask, -mask, advantage=-0.5),
    ]
    batch = pack_sequences(seqs, 32).arrays
    # old log-probs below the fresh model's (about -log 64): ratios near 2.3, no clip on A < 0
    batch = batch._replace(old_logprobs=np.full(batch.loss_mask.shape, -5.0, np.float32))
    lrs = []
    for _ in range(3):
        metrics = trainer.dapo_update(batch)
        assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0
        lrs.append(metrics["lr"])
    assert lrs == pytest.approx([0.0, 5e-4, 1e-3])
    assert cfg.optimizer.warmup_steps == 0  # the config itself is left as it was
