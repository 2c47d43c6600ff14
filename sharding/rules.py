"""Logical-axis rules as data, and the NamedShardings they give params, optimizer state and batches.

A rule maps a logical name (what a dimension *is*: `embed`, `heads`, `batch`, ...) to mesh axes.
Params and activations only ever name logical axes; the rules decide the parallelism. A mesh axis
is used at most once per array, and an axis whose size does not divide the dimension is dropped
for that dimension (it stays replicated there), so any rule set gives a valid sharding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sharding.errors import ShardingError
from sharding.logical import Rules, logical_to_spec

# Params: FSDP shards the embed dim over fsdp and context (context ranks hold different tokens of
# the same model, so they share the parameter shards too); tensor parallelism splits heads/mlp/vocab.
# Activations: the batch over data and fsdp, the sequence over context, heads/mlp over tensor.
DEFAULT_RULES: dict[str, tuple[str, ...] | None] = {
    "layers": None,
    "embed": ("fsdp", "context"),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": None,
    "mlp": ("tensor",),
    "vocab": ("tensor",),
    "batch": ("data", "fsdp"),
    "length": ("context",),
    "act_embed": None,
    "act_heads": ("tensor",),
    "act_kv_heads": ("tensor",),
    "act_mlp": ("tensor",),
    "act_vocab": ("tensor",),
}


def make_rules(overrides: Mapping[str, str | Sequence[str] | None] | None = None) -> dict[str, Any]:
    """DEFAULT_RULES updated by `overrides` (e.g. config `mesh.rules`), values as tuples or None."""
    rules: dict[str, Any] = dict(DEFAULT_RULES)
    for name, target in (overrides or {}).items():
        rules[name] = (target,) if isinstance(target, str) else (tuple(target) if target else None)
    return rules


def check_rules(rules: Rules, axis_names: Sequence[str]) -> None:
    """Raise ShardingError when a rule names a mesh axis the mesh does not have."""
    for name, target in rules.items():
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        unknown = [a for a in targets if a not in axis_names]
        if unknown:
            raise ShardingError(
                f"sharding rule {name!r} -> {list(targets)} names mesh axes {unknown} "
                f"not in the mesh {list(axis_names)}"
            )


def spec_for_shape(
    names: Sequence[str | None], shape: Sequence[int], sizes: Mapping[str, int], rules: Rules
) -> PartitionSpec:
    """PartitionSpec of an array of `shape` whose dims are `names`; drops axes that don't divide."""
    if len(names) != len(shape):
        raise ShardingError(f"logical axes {tuple(names)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    axes = []
    for name, dim in zip(names, shape, strict=True):
        target = rules.get(name) if name is not None else None
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        chosen: list[str] = []
        for axis in targets:
            if axis in used or sizes.get(axis, 1) == 1:
                continue
            if dim % (math.prod(sizes[a] for a in chosen) * sizes[axis]) == 0:
                chosen.append(axis)
        used.update(chosen)
        axes.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
    return PartitionSpec(*axes)


def shard_shape(shape: Sequence[int], spec: PartitionSpec, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The per-device shape of an array of `shape` laid out by `spec` on a mesh of `sizes`."""
    out = []
    for i, dim in enumerate(shape):
        entry = spec[i] if i < len(spec) else None
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        out.append(dim // math.prod(sizes[a] for a in axes))
    return tuple(out)


def _is_names(x: Any) -> bool:
    return isinstance(x, tuple) and all(n is None or isinstance(n, str) for n in x)


def param_shardings(mesh: Mesh, rules: Rules, logical_axes: Any, abstract_params: Any) -> Any:
    """NamedSharding per param from its logical names (tree of tuples) and shape (tree of arrays)."""
    check_rules(rules, mesh.axis_names)
    sizes = dict(mesh.shape)
    flat_names, treedef = jax.tree.flatten(logical_axes, is_leaf=_is_names)
    flat_params = treedef.flatten_up_to(abstract_params)
    specs = [spec_for_shape(n, p.shape, sizes, rules) for n, p in zip(flat_names, flat_params, strict=True)]
    return jax.tree.unflatten(treedef, [NamedSharding(mesh, s) for s in specs])


def opt_state_shardings(
    mesh: Mesh, optimizer: optax.GradientTransformation, params_shardings: Any, abstract_params: Any
) -> Any:
    """Shardings of `optimizer.init(params)`: per-param leaves (Adam m, v) follow their param, the rest
    (step counts) are replicated."""
    abstract_state = jax.eval_shape(optimizer.init, abstract_params)
    replicated = NamedSharding(mesh, PartitionSpec())
    return optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        abstract_state,
        params_shardings,
        transform_non_params=lambda _: replicated,
    )


def batch_sharding(mesh: Mesh, rules: Rules, ndim: int = 2) -> NamedSharding:
    """Sharding of a [B, T, ...] batch leaf: batch over `batch` axes, tokens over `length` axes."""
    names = ("batch", "length") + (None,) * (ndim - 2)
    return NamedSharding(mesh, logical_to_spec(names[:ndim], rules))


def replicated(mesh: Mesh) -> NamedSharding:
    """A fully replicated sharding on `mesh` (scalars, step counters, metrics)."""
    return NamedSharding(mesh, PartitionSpec())
