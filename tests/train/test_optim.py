"""Optimizer from config: schedule shape, AdamW + clipping against a NumPy reference, accumulation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxswe.config import OptimizerSection
from jaxswe.optim import make_optimizer, make_schedule, micro_batched_value_and_grad


def test_cosine_schedule_warms_up_then_decays_to_zero():
    cfg = OptimizerSection(lr=5e-6, warmup_steps=10, schedule="cosine", total_steps=50)
    sched = make_schedule(cfg)
    assert float(sched(0)) == 0.0
    np.testing.assert_allclose(sched(5), 2.5e-6, rtol=1e-6)
    np.testing.assert_allclose(sched(10), 5e-6, rtol=1e-6)
    np.testing.assert_allclose(sched(30), 2.5e-6, rtol=1e-5)  # halfway through the cosine
    assert abs(float(sched(50))) < 1e-12
    values = [float(sched(s)) for s in range(10, 51)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_constant_schedule_with_and_without_warmup():
    np.testing.assert_allclose(make_schedule(OptimizerSection(lr=1e-6))(123), 1e-6)
    sched = make_schedule(OptimizerSection(lr=1e-6, warmup_steps=4))
    np.testing.assert_allclose([sched(s) for s in (0, 2, 4, 100)], [0, 5e-7, 1e-6, 1e-6], rtol=1e-6)


def test_adamw_with_clipping_matches_numpy():
    cfg = OptimizerSection(lr=1e-2, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
    opt = make_optimizer(cfg)
    params = {"w": jnp.array([1.0, -2.0, 3.0])}
    grads = {"w": jnp.array([3.0, 4.0, 0.0])}  # global norm 5 -> clipped to 1
    state = opt.init(params)
    updates, _ = opt.update(grads, state, params)
    new = optax.apply_updates(params, updates)
    g = np.array([3.0, 4.0, 0.0]) / 5.0
    m, v = 0.1 * g, 0.001 * g**2
    m_hat, v_hat = m / 0.1, v / 0.001
    p = np.array([1.0, -2.0, 3.0])
    expected = p - 1e-2 * (m_hat / (np.sqrt(v_hat) + 1e-8) + 0.1 * p)
    np.testing.assert_allclose(new["w"], expected, rtol=1e-5)


@pytest.mark.parametrize("num_micro", [1, 2, 4])
def test_accumulated_gradients_equal_full_batch(num_micro):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(8, 5)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(8,)), jnp.float32)
    params = {"w": jnp.asarray(rng.normal(size=(5,)), jnp.float32), "b": jnp.zeros((), jnp.float32)}

    def loss_fn(p, batch):
        err = batch["x"] @ p["w"] + p["b"] - batch["y"]
        return jnp.sum(err**2) / 8.0, {"sq": jnp.mean(err**2)}

    (loss, _), grads = jax.jit(micro_batched_value_and_grad(loss_fn, num_micro))(params, {"x": x, "y": y})
    (ref_loss, _), ref_grads = jax.value_and_grad(loss_fn, has_aux=True)(params, {"x": x, "y": y})
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for k in params:
        np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-5, atol=1e-6)


def test_micro_batches_must_divide_batch():
    with pytest.raises(ValueError, match="not divisible"):
        micro_batched_value_and_grad(lambda p, b: (jnp.sum(b), {}), 4)({}, jnp.ones((6, 2)))


@pytest.mark.parametrize("num_micro", [2, 4])
def test_micro_batched_aux_equals_full_batch_aux(num_micro):
    """DAPO's aux (token means, ratio max, token count) over micro-batches with very different
    token counts comes back as the full-batch value, not a mean of per-micro-batch means."""
    from jaxswe.losses import dapo_loss

    rng = np.random.default_rng(3)
    b, t = 8, 6
    mask = np.zeros((b, t), np.float32)
    for row, n in enumerate([6, 1, 5, 2, 6, 1, 3, 4]):
        mask[row, :n] = 1.0
    batch = {
        "old": jnp.asarray(rng.normal(scale=0.3, size=(b, t)), jnp.float32),
        "adv": jnp.asarray(rng.normal(size=(b,)), jnp.float32),
        "mask": jnp.asarray(mask),
        "x": jnp.asarray(rng.normal(size=(b, t)), jnp.float32),
    }
    params = {"s": jnp.asarray(0.5, jnp.float32)}
    total = float(mask.sum())

    def loss_fn(p, mb):
        return dapo_loss(p["s"] * mb["x"], mb["old"], mb["adv"], mb["mask"], num_tokens=total)

    (_, aux), _ = jax.jit(micro_batched_value_and_grad(loss_fn, num_micro))(params, batch)
    _, ref = loss_fn(params, batch)
    assert set(aux) == set(ref)
    for key in ref:
        np.testing.assert_allclose(aux[key], ref[key], rtol=1e-5, atol=1e-7, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("skip", [["norms", "biases"], [], ["norms", "biases", "embeddings"]])
def test_weight_decay_skips_the_configured_groups(skip):
    """With zero gradients one AdamW step only decays: w -> w * (1 - lr * wd) where decay applies."""
    from jaxswe.model import get_preset, init_params

    cfg = get_preset("tiny", tie_word_embeddings=False)
    params = jax.tree.map(lambda x: x + 0.5, init_params(cfg, jax.random.key(0)))
    opt = make_optimizer(OptimizerSection(lr=0.1, weight_decay=0.5, decay_skip=skip, grad_clip=None))
    updates, _ = opt.update(jax.tree.map(jnp.zeros_like, params), opt.init(params), params)
    new = optax.apply_updates(params, updates)
    skipped = {"norms": {"attn_norm", "mlp_norm", "final_norm"}, "biases": {"bq", "bk", "bv"},
               "embeddings": {"embed", "lm_head"}}  # fmt: skip
    names = set().union(*(skipped[g] for g in skip))
    pairs = zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(new), strict=True)
    for (path, old), got in pairs:
        name = path[-1].key
        np.testing.assert_allclose(
            got, old if name in names else old * (1 - 0.1 * 0.5), rtol=1e-6, err_msg=name
        )
    assert OptimizerSection().decay_skip == ["norms", "biases"]
