"""Context-parallel causal attention over the mesh's sequence axis (`length` rule, usually `context`).

Each device holds T/n tokens. For causal load balance the sequence is first put in "zigzag"
order (`reorder_for_context`): cut into 2n chunks, device i holds chunks i and 2n-1-i, so every
device has the same number of unmasked query-key pairs; positions and segment ids are reordered
the same way, and masks use positions, so the order is invisible to the math. Results come back
in the original order with `restore_order`.

Two ways to see the other devices' keys/values:
- "ring": K/V (with their positions and segments) travel around the ring by `ppermute`, n steps;
  the next hop is issued before this step's compute so XLA can overlap them; partial results
  are merged by log-sum-exp. Gradients: autodiff through ppermute, each step's local attention
  has its own flash VJP.
- "allgather": all-gather K/V once, then local flash attention over the whole sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from sharding.errors import ShardingError
from sharding.flash import flash_attention, on_nvidia_gpu, resolve_impl
from sharding.logical import Rules
from sharding.rules import spec_for_shape

AttentionFn = Callable[..., jax.Array]


def zigzag_order(length: int, n: int) -> np.ndarray:
    """Index array: position k of the reordered sequence holds original token order[k]."""
    if length % (2 * n):
        raise ShardingError(f"sequence length {length} must be divisible by 2 x context size = {2 * n}")
    chunk = length // (2 * n)
    chunks = [c for i in range(n) for c in (i, 2 * n - 1 - i)]
    return np.concatenate([np.arange(c * chunk, (c + 1) * chunk) for c in chunks])


def reorder_for_context(x: jax.Array, n: int, axis: int = 1) -> jax.Array:
    """Put the sequence axis of `x` in zigzag order for a context axis of size n (identity for n=1)."""
    if n == 1:
        return x
    return jnp.take(x, zigzag_order(x.shape[axis], n), axis=axis)


def restore_order(x: jax.Array, n: int, axis: int = 1) -> jax.Array:
    """Inverse of `reorder_for_context`."""
    if n == 1:
        return x
    return jnp.take(x, np.argsort(zigzag_order(x.shape[axis], n)), axis=axis)


def context_axes(mesh: Mesh, rules: Rules) -> tuple[str, ...]:
    """The mesh axes (size > 1) that the `length` rule shards the sequence over."""
    target = rules.get("length")
    targets = (target,) if isinstance(target, str) else tuple(target or ())
    return tuple(a for a in targets if mesh.shape.get(a, 1) > 1)


def context_size(mesh: Mesh, rules: Rules) -> int:
    """How many devices share one sequence (1: no context parallelism)."""
    return int(np.prod([mesh.shape[a] for a in context_axes(mesh, rules)], dtype=int))


def _merge(o_acc, lse_acc, o_new, lse_new):
    lse = jnp.logaddexp(lse_acc, lse_new)
    w_acc, w_new = jnp.exp(lse_acc - lse)[..., None], jnp.exp(lse_new - lse)[..., None]
    return o_acc * w_acc + o_new.astype(jnp.float32) * w_new, lse


def make_context_attention(
    mesh: Mesh,
    rules: Rules,
    kind: Literal["ring", "allgather"] = "ring",
    *,
    block: int = 512,
    impl: str = "auto",
) -> AttentionFn:
    """An attention_fn(q_bthd, k_bshd, v_bshd, *, q_positions, kv_positions, q_segment_ids,
    kv_segment_ids, scale=None) that shards the sequence over the `length` rule's mesh axes.

    Inputs are global arrays whose sequence is already in zigzag order (`reorder_for_context`).
    `impl` is the local kernel (`sharding.flash.IMPLS`; "auto": fused Pallas on NVIDIA GPUs).
    """
    if kind not in ("ring", "allgather"):
        raise ShardingError(f"context attention kind must be 'ring' or 'allgather', got {kind!r}")
    targets = list(mesh.devices.flat)  # "auto" is for the devices compiled for, not the host
    impl = resolve_impl(impl, targets)
    interpret = not on_nvidia_gpu(targets)  # the fused kernel off NVIDIA GPUs: Pallas's interpreter
    axes = context_axes(mesh, rules)
    n = context_size(mesh, rules)
    sizes = dict(mesh.shape)
    axis_name = axes if len(axes) != 1 else axes[0]

    def local(q, k, v, qpos, kpos, qseg, kseg, *, scale):
        flash = lambda kk, vv, kp, ks: flash_attention(
            q,
            kk,
            vv,
            q_positions=qpos,
            kv_positions=kp,
            q_segment_ids=qseg,
            kv_segment_ids=ks,
            scale=scale,
            block_q=block,
            block_kv=block,
            impl=impl,
            interpret=interpret,
        )
        if n == 1:
            return flash(k, v, kpos, kseg)[0]
        if kind == "allgather":
            gather = lambda x: jax.lax.all_gather(x, axis_name, axis=1, tiled=True)
            return flash(gather(k), gather(v), gather(kpos), gather(kseg))[0]
        perm = [(i, (i + 1) % n) for i in range(n)]
        kv = (k, v, kpos, kseg)
        o_acc = lse_acc = None
        for step in range(n):
            nxt = jax.lax.ppermute(kv, axis_name, perm) if step < n - 1 else None
            o_s, lse_s = flash(*kv)
            if o_acc is None:
                o_acc, lse_acc = o_s.astype(jnp.float32), lse_s
            else:
                o_acc, lse_acc = _merge(o_acc, lse_acc, o_s, lse_s)
            kv = nxt
        return o_acc.astype(q.dtype)

    def attention_fn(
        q_bthd, k_bshd, v_bshd, *, q_positions, kv_positions, q_segment_ids, kv_segment_ids, scale=None
    ):
        if q_segment_ids is None or kv_segment_ids is None:  # one segment per row
            q_segment_ids = jnp.ones(q_bthd.shape[:2], jnp.int32)
            kv_segment_ids = jnp.ones(k_bshd.shape[:2], jnp.int32)
        spec = lambda names, x: spec_for_shape(names, x.shape, sizes, rules)
        q_spec = spec(("batch", "length", "act_heads", None), q_bthd)
        kv_spec = spec(("batch", "length", "act_kv_heads", None), k_bshd)
        if q_spec[2] != kv_spec[2]:  # GQA groups must stay whole on a device
            q_spec = kv_spec = PartitionSpec(q_spec[0], q_spec[1], None, None)
        if q_spec[1] != (axis_name if n > 1 else None) and n > 1:
            raise ShardingError(f"sequence length {q_bthd.shape[1]} cannot be split over context axes {axes}")
        t_spec = PartitionSpec(q_spec[0], q_spec[1])
        body = lambda *a: local(*a, scale=scale)
        return jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(q_spec, kv_spec, kv_spec, t_spec, t_spec, t_spec, t_spec),
            out_specs=q_spec,
            check_vma=False,
        )(q_bthd, k_bshd, v_bshd, q_positions, kv_positions, q_segment_ids, kv_segment_ids)

    return attention_fn
