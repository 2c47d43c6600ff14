"""What the compiler says a config's training step needs per device, with nothing allocated.

`compile_memory(cfg)` builds the DAPO (rl) or SFT (rft) step and the old-log-prob recompute pass
with the Trainer's own `jaxswe.train.trainer.make_steps` (same optimizer, loss settings, mesh
rules, micro-batching) on the given devices, lowers them with `jax.ShapeDtypeStruct` inputs at
the config's real shapes (the fullest step: rows = trajectories_per_step / batch_size) and reads
XLA's memory analysis of each compiled executable, plus the per-device bytes of every argument
from the compiled input shardings. `devices` are the mesh's devices: fake CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=N) or compile-only CUDA devices of a deviceless
topology (`cuda_devices`, no GPU needed).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxswe.config import RunConfig
from jaxswe.losses import LossSettings
from jaxswe.plan import model_config_of
from jaxswe.policy import model_knobs, stage_model
from jaxswe.train.state import TrainState, abstract_params
from jaxswe.train.trainer import make_steps
from sharding import make_rules
from sharding.flash import IMPLS, resolve_impl
from sharding.mesh import AXES, resolve_axis_sizes

# An H200 as XLA's GPU compiler sees it (GpuTargetConfigProto, text format): the datasheet's
# memory and bandwidth on Hopper's sm_90 (the H100's SM count, caches and limits).
H200_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 4800000000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 150754820096
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 12 minor: 8 patch: 0 }
device_description_str: "NVIDIA H200"
"""


def cuda_devices(count: int) -> list[Any]:
    """`count` compile-only H200 devices (deviceless AOT; needs the jax CUDA plugin, not a GPU)."""
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(platform="cuda", target_config=H200_TARGET, topology=f"1x1x{count}")
    return list(topo.devices)


@dataclasses.dataclass(frozen=True)
class CompiledMemory:
    """Per-device bytes of one compiled executable (XLA's memory analysis) and of its arguments."""

    arguments: int
    outputs: int
    aliased: int  # outputs that reuse donated arguments
    temporaries: int
    args_by_group: dict[str, int]  # per-device bytes of params / optimizer / batch arguments

    @property
    def peak(self) -> int:
        """Arguments + temporaries + outputs that do not reuse an argument's buffer."""
        return self.arguments + self.temporaries + self.outputs - self.aliased

    def to_json(self) -> dict[str, Any]:
        return dict(dataclasses.asdict(self), peak=self.peak)


def _shard_bytes(leaf: Any, sharding: Any) -> int:
    return math.prod(sharding.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize


def analyse(compiled: Any, groups: dict[str, Any]) -> CompiledMemory:
    ma = compiled.memory_analysis()
    shardings = compiled.input_shardings[0]
    flat_sh = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    by_group, i = {}, 0
    for name, tree in groups.items():
        leaves = jax.tree.leaves(tree)
        by_group[name] = sum(
            _shard_bytes(x, s) for x, s in zip(leaves, flat_sh[i : i + len(leaves)], strict=True)
        )
        i += len(leaves)
    return CompiledMemory(
        arguments=int(ma.argument_size_in_bytes),
        outputs=int(ma.output_size_in_bytes),
        aliased=int(ma.alias_size_in_bytes),
        temporaries=int(ma.temp_size_in_bytes),
        args_by_group=by_group,
    )


def trainer_model(cfg: RunConfig, **changes: Any) -> Any:
    """The Qwen2Config a stage's Trainer gets (config shape + model knobs + stage context)."""
    mc, _ = model_config_of(cfg)
    return stage_model(mc.replace(**model_knobs(cfg), **changes), cfg)


def _mesh(cfg: RunConfig, devices: Sequence[Any]) -> Mesh:
    sizes = resolve_axis_sizes(cfg.mesh.axes, len(devices))
    names = AXES + tuple(n for n in sizes if n not in AXES)
    return Mesh(np.asarray(devices).reshape([sizes.get(n, 1) for n in names]), names)


def compile_programs(
    cfg: RunConfig, devices: Sequence[Any], stage: str | None = None, **model_changes: Any
) -> dict[str, tuple[Any, dict[str, Any]]]:
    """{"step": ..., "recompute": ...}: each compiled executable of the config's training stage with
    its argument groups (`model_changes`, e.g. num_layers, resize the model for per-layer slopes)."""
    stage = stage or ("rl" if "rl" in cfg.stages else "rft")
    model_cfg = trainer_model(cfg, **model_changes)
    mesh, rules = _mesh(cfg, devices), make_rules(cfg.mesh.rules)
    loss = LossSettings.from_rl(cfg.rl)
    steps = make_steps(model_cfg, cfg.optimizer, mesh, rules, cfg.mesh.context_attention, loss)
    if stage == "rl":
        rows, seq, step = cfg.rl.trajectories_per_step, cfg.rl.seq_len, steps.dapo
    else:
        rows, seq, step = cfg.sft.batch_size, cfg.sft.seq_len, steps.sft
    params = abstract_params(model_cfg)
    state = TrainState(
        params=params,
        opt_state=jax.eval_shape(steps.optimizer.init, params),
        step=jax.ShapeDtypeStruct((), jnp.int32),
    )
    floats = ("loss_mask", "advantages", "rollout_logprobs", "old_logprobs")
    dtypes = dict.fromkeys(floats, jnp.float32)
    batch = {k: jax.ShapeDtypeStruct((rows, seq), dtypes.get(k, jnp.int32)) for k in step.fields}
    lp_batch = {k: batch[k] for k in ("input_ids", "positions", "segment_ids")}
    return {
        "step": (
            step.jitted.lower(state, batch).compile(),
            {"params": params, "optimizer": state.opt_state, "step": state.step},
        ),
        "recompute": (steps.logprobs.jitted.lower(params, lp_batch).compile(), {"params": params}),
    }


def compile_memory(
    cfg: RunConfig, devices: Sequence[Any], stage: str | None = None, **model_changes: Any
) -> dict[str, CompiledMemory]:
    """{"step": ..., "recompute": ...} per-device compiled memory of the config's training stage."""
    programs = compile_programs(cfg, devices, stage, **model_changes)
    return {name: analyse(compiled, groups) for name, (compiled, groups) in programs.items()}


def attention_kernel(cfg: RunConfig, devices: Sequence[Any]) -> str:
    """The attention kernel the config compiles with on `devices` ("auto" resolved for them)."""
    kind = trainer_model(cfg).attention
    return resolve_impl(kind, devices) if kind in IMPLS else kind


def conditionals(hlo_text: str) -> int:
    """`conditional` ops in an HLO module's text: data-dependent branches, each a host sync on a GPU."""
    return hlo_text.count(" conditional(")


def config_devices(cfg: RunConfig) -> int:
    return cfg.mesh.num_hosts * cfg.mesh.devices_per_host


__all__ = [
    "H200_TARGET",
    "CompiledMemory",
    "analyse",
    "attention_kernel",
    "compile_memory",
    "compile_programs",
    "conditionals",
    "config_devices",
    "cuda_devices",
    "trainer_model",
]


_NODE = re.compile(
    r"^(?P<indent>[\s│├└─]*)(?P<name>.+?) \([\d.]+%, total: [\d ]+ bytes, current: (?P<cur>[\d ]+) bytes"
)


def _item_of(name: str, path: tuple[str, ...]) -> str:
    """The planner item a buffer live at the peak belongs to, from its HLO name and the op_name
    scopes above it (XLA's "stack trace breakdown for peak usage")."""
    scopes = " ".join(path + (name,))
    if scopes.startswith("state") or " state" in scopes:
        return "optimizer" if "opt_state" in scopes else "params"
    if path[:1] == ("params",) or name == "params":
        return "params"
    if path[:1] == ("batch",) or name == "batch":
        return "batch"
    if "wrapped_transpose" in name:
        return "layout_copies"
    if "vocab_stats" in scopes or "embed_lookup" in scopes:
        return "head_backward"  # sharding.vocab's scopes: the LM head and the embedding lookup
    layer_bwd = any(p.endswith("transpose(jvp())/while") for p in path)
    if name.startswith("param.") or name.endswith("transpose(jvp())/while{1}"):
        return "grads"  # loop-carried: the accumulator and this micro-batch's stacked gradients
    if layer_bwd:
        return "layer_recompute"
    if "/jvp()/while" in name:
        return "activations"  # the forward layer scan's saved inputs
    if any(p.endswith("closed_call/while") for p in path):
        return "layer_forward"
    return "other"


def peak_items(live_range_txt: str) -> dict[str, int]:
    """Bytes live at the peak of a compiled module, by planner item, from the
    `*-live-range.txt` file XLA writes under --xla_dump_to (GPU compiler)."""
    start = live_range_txt.find("Stack trace breakdown for peak usage")
    if start < 0:
        raise ValueError("no peak breakdown in this live-range dump")
    items: dict[str, int] = {}
    stack: list[tuple[int, str]] = []
    for line in live_range_txt[start:].splitlines()[2:]:  # [1] is the module's root
        m = _NODE.match(line)
        if m is None:
            continue
        depth = len(m["indent"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        cur = int(m["cur"].replace(" ", ""))
        if cur:
            key = _item_of(m["name"], tuple(n for _, n in stack if not n.startswith("region_")))
            items[key] = items.get(key, 0) + cur
        stack.append((depth, m["name"]))
    return items
