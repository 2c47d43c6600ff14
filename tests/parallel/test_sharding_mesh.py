"""Meshes, logical-axis rules and the shardings of params and optimizer state."""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxswe.model import get_preset, init_params
from jaxswe.train import init_train_state, train_state_shardings
from sharding import ShardingError, make_mesh, make_rules
from sharding.mesh import resolve_axis_sizes, split_across_hosts
from sharding.planner import PlanInput, plan
from sharding.rules import spec_for_shape


def test_make_mesh_fills_remaining_devices_and_standard_axes():
    mesh = make_mesh({"fsdp": -1, "context": 4})
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "context": 4, "tensor": 1}
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


@pytest.mark.parametrize(
    "axes, match",
    [
        ({"fsdp": 3}, "multiply to 3"),
        ({"fsdp": -1, "context": 3}, "does not divide"),
        ({"fsdp": -1, "data": -1}, "at most one"),
        ({"fsdp": 0}, "positive"),
    ],
)
def test_bad_mesh_sizes_are_named(axes, match):
    with pytest.raises(ShardingError, match=match):
        make_mesh(axes)


def test_hosts_keep_tensor_and_context_inside_a_node():
    sizes = resolve_axis_sizes({"data": 1, "fsdp": -1, "context": 4, "tensor": 2}, 128)
    ici, dcn = split_across_hosts(sizes, 8)
    assert ici == {"data": 1, "fsdp": 1, "context": 4, "tensor": 2}
    assert dcn == {"data": 1, "fsdp": 16, "context": 1, "tensor": 1}
    ici, dcn = split_across_hosts({"data": 1, "fsdp": 32, "context": 4, "tensor": 1}, 8)
    assert ici["fsdp"] == 2 and dcn["fsdp"] == 16
    with pytest.raises(ShardingError, match="inside one host"):
        split_across_hosts({"fsdp": 8, "context": 16}, 8)


def test_spec_drops_axes_that_do_not_divide_and_never_reuses_one():
    sizes = {"data": 1, "fsdp": 2, "context": 4, "tensor": 2}
    rules = make_rules()
    assert spec_for_shape(("vocab", "embed"), (10, 64), sizes, rules) == P("tensor", ("fsdp", "context"))
    assert spec_for_shape(("vocab", "embed"), (10, 6), sizes, rules) == P("tensor", "fsdp")
    assert spec_for_shape(("heads", "kv_heads"), (4, 4), sizes, make_rules({"kv_heads": "tensor"})) == P(
        "tensor", None
    )
    with pytest.raises(ShardingError, match="do not match shape"):
        spec_for_shape(("embed",), (4, 4), sizes, rules)


def test_rules_naming_unknown_mesh_axes_are_refused():
    cfg = get_preset("tiny")
    with pytest.raises(ShardingError, match="not in the mesh"):
        train_state_shardings(cfg, optax.adamw(1e-3), make_mesh({"fsdp": 8}), make_rules({"embed": "expert"}))


@pytest.mark.slow
@pytest.mark.parametrize(
    "axes", [{"fsdp": 8}, {"fsdp": 2, "context": 4}, {"data": 2, "fsdp": 2, "tensor": 2}]
)
def test_planner_param_and_optimizer_bytes_equal_actual_shards(axes):
    cfg = get_preset("tiny", tie_word_embeddings=False, intermediate_size=96)
    mesh, rules = make_mesh(axes), make_rules()
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    state = init_train_state(
        init_params(cfg, jax.random.key(0)), opt, train_state_shardings(cfg, opt, mesh, rules)
    )
    for leaf in jax.tree.leaves(state.opt_state):  # Adam moments follow their params
        if leaf.ndim:
            assert leaf.sharding.spec in {p.sharding.spec for p in jax.tree.leaves(state.params)}

    def bytes_on(device, tree):
        return sum(
            s.data.nbytes
            for x in jax.tree.leaves(tree)
            for s in x.addressable_shards
            if s.device == device and x.ndim
        )

    shape = cfg.planner_shape()
    p = plan(PlanInput(shape, dict(mesh.shape), seq_len=64, rows=8, param_dtype="float32"))
    for device in jax.devices():
        assert bytes_on(device, state.params) == p.per_device_bytes["params"]
        assert bytes_on(device, state.opt_state) == p.per_device_bytes["optimizer"]
    assert p.params_total == sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
