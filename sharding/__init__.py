"""Meshes, logical-axis rules, context-parallel attention, vocabulary-sharded embedding and LM head,
and memory planning (no jaxswe imports)."""

from sharding.context import context_size, make_context_attention, reorder_for_context, restore_order
from sharding.errors import ShardingError
from sharding.flash import flash_attention
from sharding.logical import constrain, logical_to_spec, use_rules
from sharding.mesh import make_mesh
from sharding.planner import ModelShape, Plan, PlanInput, plan
from sharding.rules import (
    DEFAULT_RULES,
    batch_sharding,
    make_rules,
    opt_state_shardings,
    param_shardings,
    replicated,
)
from sharding.vocab import embed_lookup, vocab_stats

__all__ = [
    "DEFAULT_RULES",
    "ModelShape",
    "Plan",
    "PlanInput",
    "ShardingError",
    "batch_sharding",
    "constrain",
    "embed_lookup",
    "context_size",
    "flash_attention",
    "logical_to_spec",
    "make_context_attention",
    "make_mesh",
    "make_rules",
    "opt_state_shardings",
    "param_shardings",
    "plan",
    "reorder_for_context",
    "replicated",
    "restore_order",
    "use_rules",
    "vocab_stats",
]
