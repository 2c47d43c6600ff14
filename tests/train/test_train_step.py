"""Sharded SFT/DAPO steps and log-prob recomputation equal the unsharded computation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxswe.losses import LossSettings, dapo_loss, sft_loss
from jaxswe.model import get_preset, init_params, load_hf, save_hf, token_logprobs
from jaxswe.train import (
    TrainStepError,
    init_train_state,
    make_compute_logprobs,
    make_dapo_step,
    make_sft_step,
    policy_logprobs,
)
from sharding import make_mesh, make_rules

B, T = 16, 32
# Each mesh compiles a sharded step (~1 min on 2 loaded cores): context parallelism always runs,
# the tensor-parallel mesh is marked slow; between them every axis is sharded (FSDP in both).
MESHES = [
    {"fsdp": 2, "context": 4},
    pytest.param({"data": 2, "fsdp": 2, "tensor": 2}, marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    cfg = get_preset("tiny", tie_word_embeddings=False, attention_block=4, logprob_chunk=8)
    params = init_params(cfg, jax.random.key(0))
    path = save_hf(tmp_path_factory.mktemp("tiny") / "hf", cfg, params, dtype="float32")
    return cfg, params, path


def make_batch(cfg, params, seed=0):
    """Packed rows: two trajectories per row (lengths vary), padding at the end of some rows."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int32)
    seg, pos = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
    for r in range(B):
        a = rng.integers(5, 20)
        b = rng.integers(a + 3, T + 1)
        seg[r, :a], seg[r, a:b] = 1, 2
        pos[r, :a], pos[r, a:b] = np.arange(a), np.arange(b - a)
    mask = ((rng.random((B, T)) > 0.3) & (seg > 0)).astype(np.float32)
    ref = token_logprobs(
        params, cfg, jnp.asarray(ids), positions=jnp.asarray(pos), segment_ids=jnp.asarray(seg)
    )
    return {
        "input_ids": ids,
        "positions": pos,
        "segment_ids": seg,
        "loss_mask": mask,
        "old_logprobs": np.asarray(ref) + 0.2 * rng.normal(size=(B, T)).astype(np.float32),
        "advantages": rng.normal(size=(B, T)).astype(np.float32),
    }


def reference_dapo_update(cfg, params, batch, opt):
    def loss_fn(p):
        logp = token_logprobs(
            p,
            cfg,
            jnp.asarray(batch["input_ids"]),
            positions=jnp.asarray(batch["positions"]),
            segment_ids=jnp.asarray(batch["segment_ids"]),
        )
        return dapo_loss(
            logp,
            jnp.asarray(batch["old_logprobs"]),
            jnp.asarray(batch["advantages"]),
            jnp.asarray(batch["loss_mask"]),
            eps_low=0.2,
            eps_high=0.28,
        )[0]

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, _ = opt.update(grads, opt.init(params), params)
    return loss, optax.apply_updates(params, updates)


@pytest.mark.slow
@pytest.mark.parametrize("axes", MESHES, ids=lambda a: "-".join(f"{k}{v}" for k, v in a.items()))
def test_sharded_logprobs_and_dapo_step_equal_unsharded(model, axes):
    cfg, params, path = model
    batch = make_batch(cfg, params)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.1))
    mesh, rules = make_mesh(axes), make_rules()
    step = make_dapo_step(
        cfg,
        opt,
        mesh,
        rules,
        num_micro=2,
        loss=LossSettings(eps_low=0.2, eps_high=0.28),
        lr_schedule=optax.constant_schedule(1e-3),
    )
    _, sharded = load_hf(path, mesh=mesh, shardings=step.state_shardings.params)
    assert sharded["layers"]["w_up"].sharding == step.state_shardings.params["layers"]["w_up"]

    logp, entropy, var = make_compute_logprobs(cfg, mesh, rules, num_micro=2)(sharded, batch)
    want_lp, want_ent, want_var = token_logprobs(
        params,
        cfg,
        jnp.asarray(batch["input_ids"]),
        positions=jnp.asarray(batch["positions"]),
        segment_ids=jnp.asarray(batch["segment_ids"]),
        return_entropy=True,
        return_variance=True,
    )
    np.testing.assert_allclose(logp, want_lp, atol=1e-5)
    np.testing.assert_allclose(entropy, want_ent, atol=1e-5)
    np.testing.assert_allclose(var, want_var, atol=1e-4)
    assert bool(jnp.all(entropy >= 0)) and float(entropy.max()) <= np.log(cfg.vocab_size) + 1e-4

    state, metrics = step(init_train_state(sharded, opt, step.state_shardings), batch)
    want_loss, want_params = reference_dapo_update(cfg, params, batch, opt)
    np.testing.assert_allclose(metrics["loss"], want_loss, atol=1e-6)
    # Adam's first update is lr * g / (|g| + eps): an element whose gradient is near eps (1e-8) moves
    # by a fraction of lr that depends on the reduction order (seen: 1.1e-5 on 1 of 16384 elements).
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=3e-5), state.params, want_params)
    assert int(state.step) == 1 and float(metrics["tokens"]) == batch["loss_mask"].sum()
    assert set(metrics) >= {"loss", "grad_norm", "lr", "clip_fraction", "approx_kl", "entropy", "tokens"}
    assert 0 < float(metrics["clip_fraction"]) < 1 and float(metrics["approx_kl"]) > 0


@pytest.mark.slow
def test_sft_step_with_micro_batches_equals_full_batch_update(model):
    cfg, params, _ = model
    batch = make_batch(cfg, params, seed=1)
    opt = optax.adamw(1e-3)
    step = make_sft_step(cfg, opt, make_mesh({"data": 2, "fsdp": 4}), make_rules(), num_micro=2)
    state, first = step(init_train_state(params, opt, step.state_shardings), batch)
    updated = jax.tree.map(np.asarray, state.params)
    _, second = step(state, batch)  # donates `state`
    assert float(second["loss"]) < float(first["loss"])

    def loss_fn(p):  # one full batch, no mesh: the global-token normalizer makes them equal
        logp = token_logprobs(
            p,
            cfg,
            jnp.asarray(batch["input_ids"]),
            positions=jnp.asarray(batch["positions"]),
            segment_ids=jnp.asarray(batch["segment_ids"]),
        )
        return sft_loss(logp, jnp.asarray(batch["loss_mask"]))[0]

    loss, grads = jax.value_and_grad(loss_fn)(params)
    want = optax.apply_updates(params, opt.update(grads, opt.init(params), params)[0])
    np.testing.assert_allclose(first["loss"], loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), updated, want)


@pytest.mark.slow
def test_entropy_bonus_step_equals_reference_and_raises_entropy(model):
    """entropy_coef c: loss = DAPO - c * sum(mask * H) / sum(mask); with zero advantages the step
    moves only along the entropy gradient, so the trained tokens' entropy goes up."""
    cfg, params, _ = model
    batch = dict(make_batch(cfg, params, seed=3), advantages=np.zeros((B, T), np.float32))
    ids, pos, seg = (jnp.asarray(batch[k]) for k in ("input_ids", "positions", "segment_ids"))
    mask = jnp.asarray(batch["loss_mask"])
    coef, opt = 0.05, optax.sgd(1.0)

    def loss_fn(p):
        logp, ent = token_logprobs(p, cfg, ids, positions=pos, segment_ids=seg, return_entropy=True)
        pg = dapo_loss(logp, jnp.asarray(batch["old_logprobs"]), jnp.asarray(batch["advantages"]), mask)[0]
        return pg - coef * jnp.sum(mask * ent) / jnp.sum(mask)

    def mean_entropy(p):
        ent = token_logprobs(p, cfg, ids, positions=pos, segment_ids=seg, return_entropy=True)[1]
        return float(jnp.sum(mask * ent) / jnp.sum(mask))

    mesh = make_mesh({"fsdp": 1}, jax.devices()[:1])
    step = make_dapo_step(cfg, opt, mesh, make_rules(), loss=LossSettings(entropy_coef=coef))
    state, metrics = step(init_train_state(params, opt, step.state_shardings), batch)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
    want = optax.apply_updates(params, opt.update(grads, opt.init(params), params)[0])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), state.params, want)
    assert mean_entropy(state.params) > mean_entropy(params) + 1e-6  # 2e-5 at this step size


def test_policy_logprobs_unjitted_without_mesh_equal_token_logprobs(model):
    cfg, params, _ = model
    batch = make_batch(cfg, params, seed=2)
    ids, pos, seg = (jnp.asarray(batch[k]) for k in ("input_ids", "positions", "segment_ids"))
    logp, *_ = policy_logprobs(params, cfg, ids, pos, seg)
    np.testing.assert_allclose(
        logp, token_logprobs(params, cfg, ids, positions=pos, segment_ids=seg), atol=1e-6
    )


def test_bad_batches_get_one_clear_error(model):
    cfg, params, _ = model
    step = make_dapo_step(cfg, optax.adamw(1e-3), make_mesh({"fsdp": 2, "context": 4}), make_rules(), 2)
    batch = make_batch(cfg, params)
    with pytest.raises(TrainStepError, match="missing \\['advantages'\\]"):
        step(None, {k: v for k, v in batch.items() if k != "advantages"})
    with pytest.raises(TrainStepError, match="micro-batches"):
        step(None, {k: v[:6] for k, v in batch.items()})
    with pytest.raises(TrainStepError, match="divisible by 2 x context size"):
        step(None, {k: v[:, :28] for k, v in batch.items()})
    with pytest.raises(TrainStepError, match="shape"):
        step(None, dict(batch, advantages=batch["advantages"][:, :8]))
