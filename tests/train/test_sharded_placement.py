"""Sharded from the start, on 8 fake devices: after load_hf, a train step, an Orbax restore and
an export, every live weight matrix and its Adam moments sit in the trainer's shardings, one
eighth per device; none is whole on any device."""

import gc

import jax
import numpy as np
import pytest

from jaxswe.config import config_from_dict
from jaxswe.errors import UserError
from jaxswe.model.config import get_preset
from jaxswe.model.hf_io import load_hf, save_hf
from jaxswe.model.params import init_params
from jaxswe.policy import Policy, load_policy, write_model_file
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.train.trainer import Trainer, params_placement, trainer_mesh

CFG = config_from_dict({"model": {"dtype": "float32"}, "optimizer": {"lr": 1e-3}})
MODEL = get_preset("tiny", tie_word_embeddings=False, attention="dense")
MATRICES = {"embed", "lm_head", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}  # have an embed axis


def _matrix_shapes() -> set[tuple[int, ...]]:
    flat = jax.tree_util.tree_flatten_with_path(init_params(MODEL, jax.random.key(0)))[0]
    return {tuple(v.shape) for k, v in flat if str(k[-1].key) in MATRICES}


def _check_live(where: str, before: set[int]) -> int:
    """Every live array shaped like a weight matrix (params, Adam m and v) made since `before` (the
    ids live when the test began: other tests' arrays): 1/8 per device."""
    shapes, seen = _matrix_shapes(), 0
    for x in jax.live_arrays():
        if tuple(x.shape) in shapes and not x.is_deleted() and id(x) not in before:
            per_device = max(s.data.nbytes for s in x.addressable_shards)
            assert per_device * 8 == x.nbytes, (
                f"{where}: {x.shape} holds {per_device} of {x.nbytes} bytes on a device"
            )
            seen += 1
    return seen


def _check_placed(tree, where: str) -> None:
    placement = params_placement(MODEL, CFG.mesh)
    for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(placement), strict=True):
        assert x.sharding.is_equivalent_to(s, x.ndim), where


@pytest.mark.slow
def test_load_step_restore_export_stay_sharded(tmp_path):
    gc.collect()
    before = {id(x) for x in jax.live_arrays()}
    save_hf(tmp_path / "hf", MODEL, init_params(MODEL, jax.random.key(0)), dtype="bfloat16")
    model_cfg, params = load_hf(tmp_path / "hf", shardings=lambda c: params_placement(c, CFG.mesh))
    _check_placed(params, "load_hf")
    assert _check_live("after load_hf", before) == len(MATRICES)

    trainer = Trainer(model_cfg, params, CFG.optimizer, mesh_cfg=CFG.mesh)
    del params
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(0, model_cfg.vocab_size, (8, 32)).astype(np.int32),
        "positions": np.tile(np.arange(32, dtype=np.int32), (8, 1)),
        "segment_ids": np.ones((8, 32), np.int32),
        "loss_mask": np.ones((8, 32), np.float32),
    }
    trainer.sft_update(batch)
    _check_placed(trainer.params, "train step")
    assert _check_live("after a train step", before) == 3 * len(MATRICES)  # params, m, v

    stage = tmp_path / "stage"
    Checkpoints(stage / "checkpoints").save(1, trainer.state(), {})
    write_model_file(stage, Policy(model_cfg, trainer.params, str(tmp_path)))
    restored = load_policy(stage, CFG)
    _check_placed(restored.params, "restore")
    _check_live("after restore", before)

    save_hf(tmp_path / "export", model_cfg, trainer.params, dtype="bfloat16")
    _check_live("after export", before)


def test_mesh_devices_takes_the_first_devices_of_one_process():
    """`mesh.devices`: the trainer spans that many of this process's first devices (the rest could
    serve rollouts); more than there are is one clear error."""
    two = config_from_dict({"mesh": {"devices": 2}}).mesh
    mesh, _, _ = trainer_mesh(two)
    assert list(mesh.devices.flat) == jax.devices()[:2] and mesh.shape["fsdp"] == 2
    placed = params_placement(MODEL, two)
    assert all(set(s.device_set) == set(jax.devices()[:2]) for s in jax.tree.leaves(placed))
    with pytest.raises(UserError, match="mesh.devices 9: needs one process with at least that many"):
        trainer_mesh(config_from_dict({"mesh": {"devices": 9}}).mesh)
