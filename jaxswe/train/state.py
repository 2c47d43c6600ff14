"""The train state pytree (params, optimizer state, step) and its shardings."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh

from jaxswe.model.config import Qwen2Config
from jaxswe.model.params import param_logical_axes, param_shapes
from sharding import opt_state_shardings, param_shardings, replicated
from sharding.logical import Rules


@struct.dataclass
class TrainState:
    """Everything a train step updates; a pytree, donated to the step."""

    params: Any
    opt_state: Any
    step: jax.Array  # int32 scalar: optimizer steps taken


def abstract_params(config: Qwen2Config) -> Any:
    """ShapeDtypeStructs of the params (nothing allocated)."""
    dtype = jnp.dtype(config.param_dtype)
    return jax.tree.map(
        lambda shape: jax.ShapeDtypeStruct(shape, dtype),
        param_shapes(config),
        is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(i, int) for i in x),
    )


def train_state_shardings(
    config: Qwen2Config, optimizer: optax.GradientTransformation, mesh: Mesh, rules: Rules
) -> TrainState:
    """A TrainState of NamedShardings: params by the rules, Adam moments like their params."""
    shapes = abstract_params(config)
    params_sh = param_shardings(mesh, rules, param_logical_axes(config), shapes)
    return TrainState(
        params=params_sh,
        opt_state=opt_state_shardings(mesh, optimizer, params_sh, shapes),
        step=replicated(mesh),
    )


def init_train_state(
    params: Any, optimizer: optax.GradientTransformation, shardings: TrainState
) -> TrainState:
    """A TrainState at step 0 laid out by `shardings`. The state owns fresh buffers (train steps
    donate it), so `params` stay usable."""
    init = jax.jit(
        lambda p: TrainState(
            params=jax.tree.map(jnp.copy, p), opt_state=optimizer.init(p), step=jnp.zeros((), jnp.int32)
        ),
        out_shardings=shardings,
    )
    return init(params)
