"""Activation sharding by logical axis names.

Model code calls `constrain(x, ("batch", "length", "act_embed"))`; inside `use_rules(mesh, rules)`
that becomes `jax.lax.with_sharding_constraint` with the mesh axes the rules map each name to,
and outside it is the identity, so single-device code pays nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rules = Mapping[str, str | Sequence[str] | None]

_ACTIVE: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar(
    "sharding_rules", default=None
)


def logical_to_spec(names: Sequence[str | None], rules: Rules) -> PartitionSpec:
    """Map logical axis names to a PartitionSpec; unknown or None names are replicated."""
    axes = []
    used: set[str] = set()
    for name in names:
        target = rules.get(name) if name is not None else None
        if isinstance(target, str):
            target = (target,)
        target = tuple(a for a in (target or ()) if a not in used)
        used.update(target)
        axes.append(None if not target else target[0] if len(target) == 1 else target)
    return PartitionSpec(*axes)


@contextlib.contextmanager
def use_rules(mesh: Mesh, rules: Rules) -> Iterator[None]:
    """Activate logical-axis rules for `constrain` calls traced inside this block."""
    token = _ACTIVE.set((mesh, rules))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_rules() -> tuple[Mesh, Rules] | None:
    """The (mesh, rules) of the innermost `use_rules` block, or None outside one."""
    return _ACTIVE.get()


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Constrain `x`'s sharding by logical names when rules are active; identity otherwise."""
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(names, rules)))
