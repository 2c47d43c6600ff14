"""Dtypes on the path a real Hugging Face checkpoint takes: a bf16 safetensors directory (as Qwen
ships them) through the stages' loading code keeps float32 master weights and AdamW moments, so a
step at the paper's RFT lr (5e-6) moves the weights; `load_hf(p, dtype=float32)` computes in
float32 and matches transformers; FSDP all-gathers move compute-dtype (bf16) weights."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import TESTS
from hf_helpers import VOCAB, all_vocab_batch, changed_fraction, reference_logprobs, write_bf16_checkpoint
from rl_toy_helpers import toy_tokenizer

from jaxswe.config import config_from_dict
from jaxswe.model import get_preset, init_params, load_hf, token_logprobs
from jaxswe.stages.rft import rft_trainer
from jaxswe.stages.runtime import resolve_policy
from jaxswe.train import init_train_state, make_sft_step
from sharding import make_mesh, make_rules


@pytest.mark.parametrize(
    "hidden,tied", [(96, False), (64, True)], ids=["head_dim=hidden/heads", "explicit-head_dim-tied"]
)
def test_float32_load_of_bf16_checkpoint_matches_transformers(tmp_path, hidden, tied):
    reference = write_bf16_checkpoint(tmp_path, hidden=hidden, tied=tied)
    config, params = load_hf(tmp_path, dtype=jnp.float32)
    assert (config.dtype, config.param_dtype) == ("float32", "float32")
    assert config.head_dim == 16 and config.num_groups == 3 and config.vocab_size % 128
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    ids = np.random.default_rng(1).integers(0, VOCAB, size=(2, 40))
    logp = jax.jit(token_logprobs, static_argnames="config")(
        params, config=config, input_ids=jnp.asarray(ids)
    )
    np.testing.assert_allclose(np.asarray(logp), reference_logprobs(reference, ids), atol=1e-4)


def test_load_hf_names_its_dtypes(tmp_path):
    write_bf16_checkpoint(tmp_path)
    config, params = load_hf(tmp_path, dtype="bfloat16", param_dtype="float32")
    assert (config.dtype, config.param_dtype) == ("bfloat16", "float32")
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    config, params = load_hf(tmp_path, dtype="bfloat16")  # serving: arrays follow the compute dtype
    assert config.param_dtype == "bfloat16" and params["embed"].dtype == jnp.bfloat16


@pytest.mark.slow
def test_bf16_checkpoint_trains_with_float32_masters_at_rft_lr(tmp_path):
    write_bf16_checkpoint(tmp_path / "hf")
    toy_tokenizer(2, tmp_path / "tok")
    cfg = config_from_dict(
        {
            "stages": ["rft"],
            "model": {"path": str(tmp_path / "hf"), "tokenizer": str(tmp_path / "tok"), "remat": "none"},
            "optimizer": {"lr": 5e-6, "weight_decay": 0.1},
            "rft": {"lr": 5e-6},
        }
    )
    assert (cfg.model.dtype, cfg.model.param_dtype) == ("bfloat16", "float32")  # the shipped defaults
    policy = resolve_policy(cfg)
    trainer = rft_trainer(cfg, policy)  # the RFT stage's own loading code (8 fake devices, FSDP)
    assert trainer.model_cfg.dtype == "bfloat16"
    state = trainer.state()
    adam = [s for s in jax.tree.leaves(state["opt_state"]["optimizer"], is_leaf=lambda x: hasattr(x, "mu"))
            if hasattr(s, "mu")]  # fmt: skip
    assert len(adam) == 1
    for tree in (state["params"], adam[0].mu, adam[0].nu):
        assert {x.dtype for x in jax.tree.leaves(tree)} == {jnp.dtype(jnp.float32)}
    before = jax.device_get(trainer.params)
    out = trainer.sft_update(all_vocab_batch(trainer.rows_multiple, 256))
    assert np.isfinite(out["loss"]) and out["lr"] == pytest.approx(5e-6)
    fraction = changed_fraction(before, jax.device_get(trainer.params))
    print(f"fraction of weights changed by one step at lr 5e-6: {fraction:.4f}")
    assert fraction > 0.99


@pytest.fixture(scope="module")
def collectives(tmp_path_factory):
    """{grad_reduce_dtype: {(collective, "dtype[shape]"): count}} of an 8-way FSDP bf16 step."""
    script = TESTS / "fsdp_collectives_child.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path_factory.mktemp("hlo"))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict[str, dict[tuple[str, str], int]] = {}
    for line in done.stdout.splitlines():
        setting, op, array, n = line.split()
        out.setdefault(setting, {})[op, array] = int(n)
    return out


@pytest.mark.slow
def test_fsdp_all_gathers_move_compute_dtype_weights(collectives):
    """After SPMD partitioning (before the CPU backend upcasts bf16 dots) every weight all-gather
    of a bf16-compute, fp32-master SFT step on an 8-way FSDP mesh is bf16, whatever the gradient
    reduction dtype."""
    for counts in collectives.values():
        gathers = {a: n for (op, a), n in counts.items() if op == "all-gather" and not a.startswith("s32")}
        assert sum(n for a, n in gathers.items() if a.startswith("bf16")) >= 12
        # the one f32 gather is the unembedding's weight gradient (an f32 dot output), not a weight
        assert sum(n for a, n in gathers.items() if a.startswith("f32")) <= 1, counts


def test_weight_gradients_are_reduced_in_float32_unless_the_knob_says_bfloat16(collectives):
    """The cross-device sums of the weight gradients (all-reduce here; XLA:GPU turns them into
    reduce-scatters) are f32 by default and bf16 with `optimizer.grad_reduce_dtype: bfloat16`;
    each layer leaf (12) has one."""

    def reductions(setting, dtype):
        return sum(
            n
            for (op, a), n in collectives[setting].items()
            if op in ("all-reduce", "reduce-scatter") and a.startswith(dtype) and not a.endswith("[]")
        )

    assert reductions("float32", "bf16") == 0, collectives["float32"]
    assert reductions("float32", "f32") >= 12
    assert reductions("bfloat16", "bf16") >= 12, collectives["bfloat16"]


def _sgd_gradients(cfg, batch):
    """{leaf path: gradient (float64)} of one SFT step on an 8-way FSDP mesh, read off an SGD(1) update."""
    params = init_params(cfg, jax.random.key(0))
    step = make_sft_step(cfg, optax.sgd(1.0), make_mesh({"fsdp": 8}), make_rules())
    new = step(init_train_state(params, optax.sgd(1.0), step.state_shardings), batch)[0].params
    return {
        jax.tree_util.keystr(path): np.float64(p) - np.float64(q)
        for (path, p), q in zip(
            jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(new), strict=True
        )
    }


def _relative_error(grads, ref, keys=None):
    keys = keys or list(ref)
    err = sum(np.sum((grads[k] - ref[k]) ** 2) for k in keys)
    return math.sqrt(err / sum(np.sum(ref[k] ** 2) for k in keys))


@pytest.mark.slow
def test_float32_gradient_reduction_is_closer_to_the_float32_compute_gradients():
    """bf16 compute, fp32 masters: with the default float32 reduction the step's gradients are
    nearer those of float32 compute than with bfloat16 reduction, overall and for every norm scale
    and bias (summed over all tokens, so most exposed to bf16 rounding)."""
    shape = dict(hidden_size=128, intermediate_size=256, vocab_size=512, remat="none", attention_block=16)
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(0, 512, (8, 32)).astype(np.int32),
        "positions": np.tile(np.arange(32, dtype=np.int32), (8, 1)),
        "segment_ids": np.ones((8, 32), np.int32),
        "loss_mask": np.ones((8, 32), np.float32),
    }
    ref = _sgd_gradients(get_preset("tiny", dtype="float32", **shape), batch)
    grads = {}
    for setting in ("float32", "bfloat16"):
        cfg = get_preset("tiny", dtype="bfloat16", grad_reduce_dtype=setting, **shape)
        grads[setting] = g = _sgd_gradients(cfg, batch)
        leaves = {k: round(_relative_error(g, ref, [k]), 5) for k in ref}
        print(f"{setting} reduction: relative error {_relative_error(g, ref):.5f}", leaves)
    f32, bf16 = grads["float32"], grads["bfloat16"]
    assert _relative_error(f32, ref) < _relative_error(bf16, ref)
    summed = [k for k in ref if re.search(r"norm|\['b[qkv]'\]", k)]
    assert len(summed) == 6
    for k in summed:
        assert _relative_error(f32, ref, [k]) < _relative_error(bf16, ref, [k]), k
