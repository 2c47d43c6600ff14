"""The paper's optimizer from config: AdamW, warm-up then cosine-to-zero or constant, clipping,
and gradient accumulation over micro-batches."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import chex
import jax
import jax.numpy as jnp
import optax

if TYPE_CHECKING:  # annotations only: the train step imports without pydantic (GPU images)
    from jaxswe.config import OptimizerSection


def make_schedule(cfg: OptimizerSection) -> optax.Schedule:
    """Linear warm-up from 0 to `lr` over `warmup_steps`, then cosine decay to 0 or constant."""
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=cfg.lr,
            warmup_steps=cfg.warmup_steps,
            decay_steps=max(cfg.total_steps, cfg.warmup_steps + 1),
            end_value=0.0,
        )
    if cfg.warmup_steps == 0:
        return optax.constant_schedule(cfg.lr)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), optax.constant_schedule(cfg.lr)],
        [cfg.warmup_steps],
    )


# Parameter groups `optimizer.decay_skip` can exempt from weight decay (names of the model's leaves).
DECAY_GROUPS = {
    "norms": frozenset({"attn_norm", "mlp_norm", "final_norm"}),
    "biases": frozenset({"bq", "bk", "bv"}),
    "embeddings": frozenset({"embed", "lm_head"}),
}


def decay_mask(skip: Sequence[str]) -> Callable[[Any], Any]:
    """params -> pytree of bools, True where AdamW's weight decay applies (not in `skip`'s groups)."""
    skipped = frozenset().union(*(DECAY_GROUPS[g] for g in skip))

    def mask(params: Any) -> Any:
        return jax.tree_util.tree_map_with_path(
            lambda path, _: getattr(path[-1], "key", None) not in skipped, params
        )

    return mask


def make_optimizer(cfg: OptimizerSection) -> optax.GradientTransformation:
    """Global-norm clipping (if set) followed by AdamW with the schedule above; weight decay skips
    the parameter groups in `cfg.decay_skip`."""
    adamw = optax.adamw(
        learning_rate=make_schedule(cfg),
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=decay_mask(cfg.decay_skip) if cfg.decay_skip else None,
    )
    if cfg.grad_clip is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw)


def split_micro_batches(batch: Any, num_micro: int) -> Any:
    """Reshape every [B, ...] leaf to [num_micro, B // num_micro, ...]."""

    def split(x: jax.Array) -> jax.Array:
        if x.shape[0] % num_micro:
            raise ValueError(f"batch size {x.shape[0]} is not divisible by {num_micro} micro-batches")
        return x.reshape(num_micro, x.shape[0] // num_micro, *x.shape[1:])

    return jax.tree.map(split, batch)


def micro_batched_value_and_grad(
    loss_fn: Callable[[Any, Any], tuple[jax.Array, dict[str, jax.Array]]], num_micro: int
) -> Callable[[Any, Any], tuple[tuple[jax.Array, dict[str, jax.Array]], Any]]:
    """`jax.value_and_grad(loss_fn, has_aux=True)` over a batch split into `num_micro` micro-batches,
    loss, aux and gradients summed in a scan; with one micro-batch, that function itself.

    `loss_fn` must already normalize by the global token count (losses' `num_tokens`), so the sum
    over micro-batches equals the full-batch value. aux entries come back as full-batch values:
    when aux has `num_tokens` (the micro-batch's trained tokens) the other entries are token-weighted
    means over micro-batches and `num_tokens` their sum, else plain means; entries named `*_max`
    take the maximum. Runs as a `lax.scan`, so only one micro-batch's activations live at a time.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if num_micro == 1:
        return grad_fn
    return functools.partial(_accumulate, grad_fn, num_micro=num_micro)


def _accumulate(grad_fn: Callable, params: Any, batch: Any, *, num_micro: int) -> tuple[tuple[Any, Any], Any]:
    """((loss, aux), grads) of `grad_fn` summed over the micro-batches, one at a time."""
    micro = split_micro_batches(batch, num_micro)
    first = jax.tree.map(lambda x: x[0], micro)
    (_, aux_shape), _ = jax.eval_shape(grad_fn, params, first)
    zeros_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    zeros_aux = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), aux_shape)

    def weight(aux):
        return aux["num_tokens"] if "num_tokens" in aux else jnp.ones((), jnp.float32)

    def combine(totals, aux):
        w = weight(aux)
        return {
            k: jnp.maximum(totals[k], v)
            if k.endswith("_max")
            else totals[k] + (v if k == "num_tokens" else w * v)
            for k, v in aux.items()
        }

    def body(carry, mb):
        loss_sum, aux_sum, weight_sum, grad_sum = carry
        (loss, aux), grads = grad_fn(params, mb)
        grad_sum = jax.tree.map(lambda s, g: s + g.astype(jnp.float32), grad_sum, grads)
        return (loss_sum + loss, combine(aux_sum, aux), weight_sum + weight(aux), grad_sum), None

    zero = jnp.zeros((), jnp.float32)
    (loss, aux_sum, weight_sum, grads), _ = jax.lax.scan(body, (zero, zeros_aux, zero, zeros_grads), micro)
    aux = {
        k: v if k.endswith("_max") or k == "num_tokens" else v / jnp.maximum(weight_sum, 1.0)
        for k, v in aux_sum.items()
    }
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    chex.assert_trees_all_equal_shapes(grads, params)
    return (loss, aux), grads
