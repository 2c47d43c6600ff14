"""Per-device memory and FLOPs of a training setup, from plain numbers (no model code, no devices).

`plan(PlanInput(...))` mirrors how `sharding.rules` lays the params out (same `spec_for_shape`),
so param, gradient and AdamW-state bytes per device are exact. The other items model what XLA's
GPU compiler allocates for jaxswe's train step and recompute pass (checked per item against
deviceless H200 compiles of every shipped config by bench/bench_planner.py): two float32 gradient
copies, the LM head's slab-wise backward, the layer inputs saved under the remat policy, float32
layout copies of two weights, and the largest transient buffer. FLOPs are 6 x matmul params x
tokens plus causal attention, times 4/3 when layers are recomputed in the backward pass; the recompute
pass is the forward alone, a third of the model FLOPs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from sharding.errors import ShardingError
from sharding.rules import make_rules, shard_shape, spec_for_shape

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
REMAT_POLICIES = ("none", "full", "save_projections")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The numbers that size a Qwen2 decoder."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tie: bool

    def params(self) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]:
        """name -> (shape, logical axis names), the layout of jaxswe.model's param pytree."""
        v, e, f, n, h, k, d = (
            self.vocab,
            self.hidden,
            self.intermediate,
            self.layers,
            self.heads,
            self.kv_heads,
            self.head_dim,
        )
        out = {
            "embed": ((v, e), ("vocab", "embed")),
            "attn_norm": ((n, e), ("layers", None)),
            "wq": ((n, e, h, d), ("layers", "embed", "heads", "head_dim")),
            "bq": ((n, h, d), ("layers", "heads", "head_dim")),
            "wk": ((n, e, k, d), ("layers", "embed", "kv_heads", "head_dim")),
            "bk": ((n, k, d), ("layers", "kv_heads", "head_dim")),
            "wv": ((n, e, k, d), ("layers", "embed", "kv_heads", "head_dim")),
            "bv": ((n, k, d), ("layers", "kv_heads", "head_dim")),
            "wo": ((n, h, d, e), ("layers", "heads", "head_dim", "embed")),
            "mlp_norm": ((n, e), ("layers", None)),
            "w_gate": ((n, e, f), ("layers", "embed", "mlp")),
            "w_up": ((n, e, f), ("layers", "embed", "mlp")),
            "w_down": ((n, f, e), ("layers", "mlp", "embed")),
            "final_norm": ((e,), (None,)),
        }
        if not self.tie:
            out["lm_head"] = ((e, v), ("embed", "vocab"))
        return out

    def num_params(self) -> int:
        return sum(math.prod(shape) for shape, _ in self.params().values())


@dataclasses.dataclass(frozen=True)
class PlanInput:
    """One training setup. `rows` packed rows of `seq_len` tokens per optimizer step, split into
    `num_micro` micro-batches; `mesh` axis sizes; `rules` logical -> mesh axes (None: defaults)."""

    model: ModelShape
    mesh: Mapping[str, int]
    seq_len: int
    rows: int
    num_micro: int = 1
    remat: str = "full"
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    grad_reduce_dtype: str = "float32"  # the gathered layer's weight gradients (jaxswe.model.precision)
    rules: Mapping[str, Any] | None = None
    attention_block: int = 512
    logprob_chunk: int = 1024
    batch_token_bytes: int = 24  # bytes per token position of the batch a step reads (DAPO 24, SFT 16)
    device_memory_bytes: int = 141 * 10**9
    headroom_fraction: float = 0.1
    peak_flops: float = 989e12  # H200 dense bf16
    mfu: float = 0.4


@dataclasses.dataclass(frozen=True)
class Plan:
    params_total: int
    devices: int
    tokens_per_device: int  # per micro-batch
    per_device_bytes: dict[str, int]  # the train step's items and their total
    largest_transient: str
    transients: dict[str, int]  # the candidates for the step's largest transient buffer
    recompute_bytes: dict[str, int]  # the old-log-prob recompute pass's items and their total
    device_memory_bytes: int
    usable_bytes: int
    fits: bool
    biggest: str
    advice: str
    model_flops: float  # per optimizer step, all devices
    hardware_flops: float  # with rematerialization
    recompute_flops: float  # the old-log-prob recompute pass: the forward alone
    step_time_s: float  # at `mfu`
    mfu: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _row_shards(sizes: Mapping[str, int], rules: Mapping[str, Any]) -> int:
    target = rules.get("batch")
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    return math.prod(sizes.get(a, 1) for a in axes)


def _axis_shards(sizes: Mapping[str, int], rules: Mapping[str, Any], name: str, dim: int) -> int:
    spec = spec_for_shape((name,), (dim,), sizes, rules)
    return dim // shard_shape((dim,), spec, sizes)[0]


def saved_bytes_per_token_layer(
    m: ModelShape, remat: str, tp_heads: int, tp_kv: int, tp_mlp: int, act_bytes: int
) -> float:
    """Bytes one token keeps per layer between forward and backward under a remat policy."""
    e, f = m.hidden, m.intermediate
    q = m.heads * m.head_dim / tp_heads
    kv = m.kv_heads * m.head_dim / tp_kv
    mlp = f / tp_mlp
    x_in = e * act_bytes  # the scanned layer's input (the carry is always kept)
    if remat == "full":
        return x_in
    projections = (2 * q + 2 * kv + 2 * e + 2 * mlp) * act_bytes  # q,k,v,attn_out,o,gate,up,down
    if remat == "save_projections":
        return x_in + projections
    # "none": also both norms' outputs, float32 norm statistics, roped q/k, flash lse, residual
    # sums, the SwiGLU product and its silu.
    extra = (2 * e + q + kv + e + 2 * mlp) * act_bytes + (2 * e + m.heads / tp_heads) * 4
    return x_in + projections + extra


def plan(inp: PlanInput) -> Plan:
    """Per-device bytes by item, whether they fit, FLOPs and step time of one optimizer step."""
    m = inp.model
    if inp.remat not in REMAT_POLICIES:
        raise ShardingError(f"remat {inp.remat!r} not in {REMAT_POLICIES}")
    for name in ("param_dtype", "compute_dtype", "grad_reduce_dtype"):
        if getattr(inp, name) not in _BYTES:
            raise ShardingError(f"{name} {getattr(inp, name)!r} not in {sorted(_BYTES)}")
    rules = make_rules(inp.rules)
    sizes = {k: int(v) for k, v in inp.mesh.items()}
    if any(v < 1 for v in sizes.values()):
        raise ShardingError(f"planner needs resolved mesh sizes (no -1), got {dict(inp.mesh)}")
    devices = math.prod(sizes.values())
    pbytes, abytes = _BYTES[inp.param_dtype], _BYTES[inp.compute_dtype]
    gbytes = _BYTES[inp.grad_reduce_dtype]

    shard_elems = 0
    layout_elems = 0  # the w_down and wo shards (see "layout_copies")
    layer_elems = 0  # one layer's params on a device after FSDP all-gather (tensor shards stay)
    for name, (shape, names) in m.params().items():
        spec = spec_for_shape(names, shape, sizes, rules)
        shard_elems += math.prod(shard_shape(shape, spec, sizes))
        if name in ("w_down", "wo"):
            layout_elems += math.prod(shard_shape(shape, spec, sizes))
        if names[0] == "layers":
            gathered = [
                s if n not in ("heads", "kv_heads", "mlp") else s // _axis_shards(sizes, rules, n, s)
                for s, n in zip(shape[1:], names[1:], strict=True)
            ]
            layer_elems += math.prod(gathered)

    ctx = _axis_shards(sizes, rules, "length", inp.seq_len)
    row_shards = _row_shards(sizes, rules)
    if inp.rows % (inp.num_micro * row_shards):
        raise ShardingError(
            f"{inp.rows} rows per step do not split into {inp.num_micro} micro-batches "
            f"x {row_shards} row shards"
        )
    rows_dev = inp.rows // inp.num_micro // row_shards
    t_dev = rows_dev * inp.seq_len // ctx
    tp_h = _axis_shards(sizes, rules, "act_heads", m.heads)
    tp_kv = _axis_shards(sizes, rules, "act_kv_heads", m.kv_heads)
    tp_f = _axis_shards(sizes, rules, "act_mlp", m.intermediate)
    tp_v = _axis_shards(sizes, rules, "act_vocab", m.vocab)

    per_tok = saved_bytes_per_token_layer(m, inp.remat, tp_h, tp_kv, tp_f, abytes)
    activations = int(m.layers * t_dev * per_tok)

    q_w, kv_w = m.heads * m.head_dim / tp_h, m.kv_heads * m.head_dim / tp_kv
    blk = min(inp.attention_block, inp.seq_len // ctx)
    # the LM head walks the vocabulary in slabs of about logprob_chunk x V logits (sharding.vocab)
    vocab_dev = m.vocab // tp_v
    slab = -(-vocab_dev // min(max(-(-t_dev // inp.logprob_chunk), 1), vocab_dev))
    layer_recompute = t_dev * (
        saved_bytes_per_token_layer(m, "none", tp_h, tp_kv, tp_f, abytes) - m.hidden * abytes
    )
    transients = {
        # scores, probabilities, dP and dS of one query x key block, float32
        "attention_block": rows_dev * (m.heads / tp_h) * blk * blk * 4 * 4,
        # K/V in flight (this hop and the next) plus per-hop float32 partial outputs kept for autodiff
        "context_ring": (4 * t_dev * kv_w * abytes + (ctx + 2) * t_dev * q_w * 4) if ctx > 1 else 0,
        # gate, up, silu product and their gradients of one layer
        "mlp": 6 * t_dev * (m.intermediate / tp_f) * abytes,
        # float32 logits, probabilities and the logits' gradient of one vocabulary slab
        "logits_slab": 3 * t_dev * slab * 4,
        # one layer's arrays recomputed in the backward pass under remat, plus the cotangents alive
        # while walking back through them (about half as many)
        "layer_recompute": 1.5 * layer_recompute if inp.remat != "none" else 0,
        # one layer's all-gathered weights (compute dtype, current + prefetched) and their unreduced
        # gradients (grad_reduce_dtype, or the compute dtype when that is wider)
        "gathered_layer": layer_elems * (2 * abytes + max(gbytes, abytes)),
    }
    largest = max(transients, key=transients.get)
    grad_copies = 1 if inp.num_micro == 1 else 2  # the micro-batch sum and this micro-batch's
    per_device = {
        "params": shard_elems * pbytes,
        "optimizer": shard_elems * 2 * 4,  # AdamW m and v in float32
        "batch": inp.batch_token_bytes * rows_dev * inp.num_micro * inp.seq_len // ctx,
        "grads": grad_copies * shard_elems * 4,  # float32
        # the LM head's backward (sharding.vocab): one gathered head slab and its gradient before
        # the reduce-scatter, and d(hidden) in float32; the lookup's gradient is a local shard
        "head_backward": slab * m.hidden * (abytes + gbytes) + t_dev * m.hidden * 4,
        "activations": activations,
        # XLA's float32 copies of the w_down and wo shards with the sharded embed axis moved first
        "layout_copies": layout_elems * 4,
        "transient": int(transients[largest]),
    }
    per_device["total"] = sum(per_device.values())
    # the recompute pass runs the step's micro-batches one at a time through the forward only
    tokens_dev = rows_dev * inp.num_micro * inp.seq_len // ctx
    recompute_transients = {
        # one layer's forward: gate, up and their product, plus two [T, E] arrays
        "layer_forward": t_dev * (3 * m.intermediate / tp_f + 2 * m.hidden) * abytes,
        # the ring's float32 partial outputs of every hop but the last, combined at the end
        "context_ring": (ctx - 1) * t_dev * q_w * 4,
        # the float32 logits of one vocabulary slab and their exponent
        "logits_slab": 2 * t_dev * slab * 4,
    }
    recompute = {
        "params": per_device["params"],
        "batch": 3 * tokens_dev * 4,
        "outputs": 2 * tokens_dev * 4,  # float32 log-probs and entropies
        "layout_copies": per_device["layout_copies"],
        "transient": int(max(recompute_transients.values())),
    }
    recompute["total"] = sum(recompute.values())
    usable = int(inp.device_memory_bytes * (1 - inp.headroom_fraction))
    fits = max(per_device["total"], recompute["total"]) <= usable
    items = {k: v for k, v in per_device.items() if k != "total"}
    biggest = max(items, key=items.get)
    # what shards over every device and no batch setting shrinks
    state = per_device["params"] + per_device["grads"] + per_device["optimizer"]
    if fits:
        advice = "fits"
    elif state > usable:
        least = -(-state * devices // usable)
        advice = (
            f"params, gradients and AdamW state alone need {state / 1e9:.0f} of {usable / 1e9:.0f} GB "
            f"a device: at least {least} devices ({-(-least // 8)} hosts of 8; now {devices}), "
            "whatever the batch settings"
        )
    else:
        advice = _advice(biggest, largest, inp, sizes)

    tokens = inp.rows * inp.seq_len
    matmul_params = m.num_params() - (0 if m.tie else m.vocab * m.hidden) - m.layers * 2 * m.hidden
    attn_flops = 6 * 2 * m.layers * m.heads * m.head_dim * inp.seq_len**2 / 2 * inp.rows  # causal half
    model_flops = 6 * matmul_params * tokens + attn_flops
    hardware_flops = model_flops * (4 / 3 if inp.remat != "none" else 1.0)
    step_time = hardware_flops / (devices * inp.peak_flops * inp.mfu)
    return Plan(
        params_total=m.num_params(),
        devices=devices,
        tokens_per_device=t_dev,
        per_device_bytes=per_device,
        largest_transient=largest,
        transients={k: int(v) for k, v in transients.items()},
        recompute_bytes=recompute,
        device_memory_bytes=inp.device_memory_bytes,
        usable_bytes=usable,
        fits=fits,
        biggest=biggest,
        advice=advice,
        model_flops=model_flops,
        hardware_flops=hardware_flops,
        recompute_flops=model_flops / 3,
        step_time_s=step_time,
        mfu=inp.mfu,
    )


def _advice(biggest: str, transient: str, inp: PlanInput, sizes: Mapping[str, int]) -> str:
    if biggest == "activations":
        if inp.remat != "full":
            return "activations dominate: set model.remat=full"
        return (
            "activations dominate: raise optimizer.micro_batches, or raise mesh context "
            f"(now {sizes.get('context', 1)}) to split each sequence over more devices"
        )
    if biggest == "head_backward":
        return "the LM head's backward dominates: lower model.logprob_chunk or raise mesh tensor"
    if biggest in ("params", "grads", "optimizer", "layout_copies", "batch"):
        return (
            f"{biggest} dominate: shard over more devices (mesh fsdp, now {sizes.get('fsdp', 1)}) "
            "or add hosts"
        )
    return {
        "attention_block": "attention block dominates: lower model.attention_block",
        "logits_slab": "log-prob chunk dominates: lower model.logprob_chunk",
        "mlp": "MLP intermediates dominate: raise mesh tensor or context",
        "context_ring": "ring buffers dominate: raise mesh context or tensor",
        "layer_recompute": "one layer's recompute dominates: raise mesh context or tensor",
        "gathered_layer": "gathered layer weights dominate: raise mesh tensor",
    }[transient]
