"""Orbax checkpoints of the parameter pytree (what training stages save and restore).

A directory written by `save_params_orbax` holds the Orbax checkpoint under `params/` and, when
given a config, its Hugging Face config.json beside it, so `jaxswe convert` can go back to HF.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxswe.errors import UserError
from jaxswe.model.config import Qwen2Config
from jaxswe.model.params import Params, param_shapes

PARAMS_DIR = "params"


class CheckpointError(UserError):
    """An Orbax parameter checkpoint that is missing or does not match the model."""


def save_params_orbax(directory: str | Path, params: Params, config: Qwen2Config | None = None) -> Path:
    """Save params (sharded arrays are written by their owners) to `directory/params`."""
    directory = Path(directory).absolute()
    target = directory / PARAMS_DIR
    if target.exists():
        raise CheckpointError(f"{target}: already exists; choose a new directory")
    directory.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(target, params)
        checkpointer.wait_until_finished()
    if config is not None and jax.process_index() == 0:
        (directory / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
    return directory


def load_params_orbax(directory: str | Path, config: Qwen2Config, shardings: Any | None = None) -> Params:
    """Restore params saved by save_params_orbax, checked against `config`'s layout.

    `shardings` (a pytree of Shardings like the params) places each array; by default arrays go
    to the first device. Arrays keep the dtype they were saved with.
    """
    target = Path(directory).absolute() / PARAMS_DIR
    if not target.is_dir():
        raise CheckpointError(f"{directory}: no Orbax params checkpoint (expected {target})")
    with ocp.StandardCheckpointer() as checkpointer:
        saved = checkpointer.metadata(target).item_metadata.tree
        expected = param_shapes(config)
        is_shape = lambda x: isinstance(x, tuple)
        want = {
            jax.tree_util.keystr(k): v for k, v in jax.tree.flatten_with_path(expected, is_leaf=is_shape)[0]
        }
        has_shape = lambda x: hasattr(x, "shape")
        got = {
            jax.tree_util.keystr(k): tuple(v.shape)
            for k, v in jax.tree.flatten_with_path(saved, is_leaf=has_shape)[0]
        }
        problems = [f"missing {k}" for k in want if k not in got] + [
            f"unexpected {k}" for k in got if k not in want
        ]
        problems += [
            f"{k} has shape {list(got[k])}, expected {list(v)}"
            for k, v in want.items()
            if k in got and got[k] != v
        ]
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            raise CheckpointError(f"{target}: does not match the model config: {problems[0]}{more}")
        default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = shardings or jax.tree.map(lambda _: default, expected, is_leaf=is_shape)
        abstract = jax.tree.map(
            lambda m, s: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=s),
            saved,
            shardings,
            is_leaf=has_shape,
        )
        return checkpointer.restore(target, abstract)
