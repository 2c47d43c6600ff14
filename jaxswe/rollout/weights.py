"""Load a model for serving from a Hugging Face directory or an Orbax checkpoint directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxswe import model as M
from jaxswe.errors import UserError
from jaxswe.model.hf_io import read_hf_config
from jaxswe.model.orbax_io import PARAMS_DIR, load_params_orbax


class ServeWeightsError(UserError):
    """A model path that cannot be served; the message names the path and the problem."""


def load_model(path: str | Path, *, dtype: str = "float32") -> tuple[Any, Any]:
    """(config, params) for inference, params and compute in `dtype`, no remat.

    `path` is a Hugging Face directory (config.json + safetensors) or a directory written by
    `save_params_orbax` (`params/` + config.json).
    """
    path = Path(path)
    if not path.is_dir():
        raise ServeWeightsError(f"{path}: model directory not found")
    jdtype = getattr(jnp, dtype)
    try:
        if (path / PARAMS_DIR).is_dir():
            cfg = read_hf_config(path)
            params = jax.tree.map(lambda x: x.astype(jdtype), load_params_orbax(path, cfg))
        else:
            cfg, params = M.load_hf(path, dtype=jdtype)
    except UserError as err:
        raise ServeWeightsError(f"{path}: {err}" if str(path) not in str(err) else str(err)) from None
    except Exception as err:  # unreadable files, wrong shapes, missing tensors
        raise ServeWeightsError(f"{path}: cannot load model: {type(err).__name__}: {err}") from None
    return cfg.replace(dtype=dtype, remat="none"), params
