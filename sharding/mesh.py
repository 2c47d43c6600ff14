"""Device meshes from axis sizes, laid out so fast axes stay inside a node.

`make_mesh({"data": 1, "fsdp": -1, "context": 4, "tensor": 1})` builds a `jax.sharding.Mesh`
over all devices (of all processes after `jax.distributed.initialize`). `tensor` and `context`
exchange the most bytes per step, so they are placed on the devices of one host (NVLink); `fsdp`
then `data` take the rest of a host and span hosts (InfiniBand).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from sharding.errors import ShardingError

AXES = ("data", "fsdp", "context", "tensor")
# Axes kept inside one host first (most traffic), in this priority.
_INTRA_HOST_ORDER = ("tensor", "context", "fsdp", "data")


def resolve_axis_sizes(axes: Mapping[str, int], num_devices: int) -> dict[str, int]:
    """Replace one -1 by the remaining device count; check the product equals `num_devices`."""
    if not axes:
        raise ShardingError("mesh axes are empty")
    bad = {k: v for k, v in axes.items() if not isinstance(v, int) or (v < 1 and v != -1)}
    if bad:
        raise ShardingError(f"mesh axis sizes must be positive or -1, got {bad}")
    free = [k for k, v in axes.items() if v == -1]
    if len(free) > 1:
        raise ShardingError(f"at most one mesh axis may be -1, got {free}")
    fixed = math.prod(v for v in axes.values() if v != -1)
    sizes = dict(axes)
    if free:
        if num_devices % fixed:
            raise ShardingError(
                f"mesh axes {dict(axes)}: fixed sizes multiply to {fixed}, "
                f"which does not divide {num_devices} devices"
            )
        sizes[free[0]] = num_devices // fixed
    if math.prod(sizes.values()) != num_devices:
        raise ShardingError(
            f"mesh axes {dict(axes)} multiply to {math.prod(sizes.values())}, "
            f"but there are {num_devices} devices"
        )
    return sizes


def split_across_hosts(
    sizes: Mapping[str, int], devices_per_host: int
) -> tuple[dict[str, int], dict[str, int]]:
    """Split each axis into (within-host, across-host) factors: tensor, context, fsdp, data fill a host.

    Returns (ici_sizes, dcn_sizes) with ici * dcn == sizes per axis and prod(ici) == devices_per_host.
    """
    ici = {k: 1 for k in sizes}
    room = devices_per_host
    for name in [a for a in _INTRA_HOST_ORDER if a in sizes] + [
        a for a in sizes if a not in _INTRA_HOST_ORDER
    ]:
        take = math.gcd(sizes[name], room)
        ici[name], room = take, room // take
    if room != 1:
        raise ShardingError(
            f"mesh axes {dict(sizes)} cannot be laid out on hosts of {devices_per_host} devices"
        )
    for name in ("tensor", "context"):
        if name in sizes and ici[name] != sizes[name]:
            raise ShardingError(
                f"mesh axis {name!r} of size {sizes[name]} must fit inside one host "
                f"({devices_per_host} devices) together with the other intra-host axes"
            )
    dcn = {k: sizes[k] // ici[k] for k in sizes}
    return ici, dcn


def make_mesh(axes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh over `devices` (default: all) with axes data, fsdp, context, tensor (in that order,
    size 1 where not given) and any other given axes; one size may be -1."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_axis_sizes(axes, len(devices))
    names = AXES + tuple(n for n in sizes if n not in AXES)
    sizes = {n: sizes.get(n, 1) for n in names}
    shape = tuple(sizes[n] for n in names)
    num_hosts = len({d.process_index for d in devices})
    if num_hosts > 1:
        ici, dcn = split_across_hosts(sizes, len(devices) // num_hosts)
        # hosts (processes) are the granules: GPUs and CPUs have no TPU slice index
        grid = mesh_utils.create_hybrid_device_mesh(
            [ici[n] for n in names], [dcn[n] for n in names], devices=devices, process_is_granule=True
        )
    else:
        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    return Mesh(grid, names)
