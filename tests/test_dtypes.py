"""Dtypes on the path a real Hugging Face checkpoint takes: a bf16 safetensors directory (as Qwen
ships them) through the stages' loading code keeps float32 master weights and AdamW moments, so a
step at the paper's RFT lr (5e-6) moves the weights; `load_hf(p, dtype=float32)` computes in
float32 and matches transformers; FSDP all-gathers move compute-dtype (bf16) weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_helpers import VOCAB, all_vocab_batch, changed_fraction, reference_logprobs, write_bf16_checkpoint
from rl_toy_helpers import toy_tokenizer

from jaxswe.config import config_from_dict
from jaxswe.model import load_hf, token_logprobs
from jaxswe.stages.rft import rft_trainer
from jaxswe.stages.runtime import resolve_policy


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


def test_fsdp_all_gathers_move_compute_dtype_weights(tmp_path):
    """After SPMD partitioning (before the CPU backend upcasts bf16 dots) every weight all-gather
    of a bf16-compute, fp32-master SFT step on an 8-way FSDP mesh is bf16."""
    script = Path(__file__).with_name("fsdp_gather_child.py")
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    counts = dict(line.split() for line in done.stdout.split("\n") if line.strip())
    weight_gathers = {k: int(v) for k, v in counts.items() if not k.startswith("s32")}
    assert sum(v for k, v in weight_gathers.items() if k.startswith("bf16")) >= 12
    # the one f32 gather is the unembedding's weight gradient (an f32 dot output), not a weight
    assert sum(v for k, v in weight_gathers.items() if k.startswith("f32")) <= 1, counts
