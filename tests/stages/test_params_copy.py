"""One params copy alive in a stage (issue 29): a stage's trainer takes the starting policy's params
over (`Policy.hand_over`), so once it is built the devices hold its state (params + AdamW moments)
and, with the embedded engine, the sampler's own copy; not the starting weights beside them (they
were: +1.00x params, 2.27 GB per GPU at 72B). configs/toy-rl.yaml on 8 fake devices (FSDP 8)."""

from __future__ import annotations

import gc

import jax
from helpers import ROOT

from jaxswe.config import load_config
from jaxswe.rl.loop import rl_trainer
from jaxswe.stages.context import open_stage
from jaxswe.stages.rft import rft_trainer
from jaxswe.train.trainer import params_placement

CONFIG = ROOT / "configs" / "toy-rl.yaml"


def device_bytes(tree) -> int:
    """Bytes of the distinct device buffers behind the arrays of `tree` (on CPU an array put from
    host memory can share the buffer of the array the host copy came from)."""
    buffers = {}
    for x in jax.tree.leaves(tree):
        for shard in x.addressable_shards:
            buffers[(shard.device.id, shard.data.unsafe_buffer_pointer())] = shard.data.nbytes
    return sum(buffers.values())


def live_bytes() -> int:
    gc.collect()
    return device_bytes(jax.live_arrays())


def _open(cfg, stage_dir):
    """The opened stage, its starting params laid out in the trainer's shards as `load_policy` lays
    out a checkpoint's (the toy's random init sits on one device)."""
    ctx = open_stage(cfg, stage_dir, init_from=None)
    ctx.policy.params = jax.device_put(ctx.policy.params, params_placement(ctx.policy.model_cfg, cfg.mesh))
    return ctx


def test_sft_trainer_holds_the_only_params_copy(tmp_path):
    cfg = load_config(CONFIG)
    before = live_bytes()
    ctx = _open(cfg, tmp_path / "rft")
    params = device_bytes(ctx.policy.params)
    trainer = rft_trainer(cfg, ctx.policy, num_steps=2)
    state = device_bytes(trainer.state())
    extra = live_bytes() - before - state
    print(f"SFT: params {params} B, trainer state {state} B, live beyond the state {extra} B")
    assert state >= 3 * params and abs(extra) < 0.01 * params  # was extra == params
    assert ctx.policy.params is None


def test_rl_trainer_holds_the_only_params_copy(tmp_path):
    """In run_rl's order: the backend opens on the starting policy, then the trainer takes it."""
    cfg = load_config(CONFIG)
    before = live_bytes()
    ctx = _open(cfg, tmp_path / "rl")
    params = device_bytes(ctx.policy.params)
    sampler = device_bytes(ctx.backend.serve().engine.sampler.params)  # the embedded engine's own
    trainer = rl_trainer(cfg, ctx.policy)
    state = device_bytes(trainer.state())
    extra = live_bytes() - before - state - sampler
    print(f"RL: params {params} B, trainer state {state} B, sampler {sampler} B, live beyond both {extra} B")
    assert sampler <= params and state >= 3 * params and abs(extra) < 0.01 * params  # was extra == params
    assert ctx.policy.params is None
