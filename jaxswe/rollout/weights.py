"""Load a model for serving (`jaxswe serve`, its weight updates) through `jaxswe.policy.load_policy`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxswe.errors import UserError
from jaxswe.policy import load_policy


class ServeWeightsError(UserError):
    """A model path that cannot be served; the message names the path and the problem."""


def load_model(path: str | Path, *, dtype: str = "float32") -> tuple[Any, Any]:
    """(config, params) for inference from anything `load_policy` reads (a Hugging Face dir, an
    Orbax params dir, a stage dir or its checkpoints/), params and compute in `dtype`, no remat;
    anything unloadable is one ServeWeightsError naming the path."""
    path = Path(path)
    if not path.is_dir():
        raise ServeWeightsError(f"{path}: model directory not found")
    try:
        policy = load_policy(path, dtype=dtype)
    except UserError as err:
        raise ServeWeightsError(f"{path}: {err}" if str(path) not in str(err) else str(err)) from None
    except Exception as err:  # unreadable files, wrong shapes, missing tensors
        raise ServeWeightsError(f"{path}: cannot load model: {type(err).__name__}: {err}") from None
    params = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), policy.params)  # Orbax dirs: as saved
    return policy.model_cfg.replace(dtype=dtype, remat="none"), params
