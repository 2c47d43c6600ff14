"""Jitted, sharded SFT and DAPO train steps and old-log-prob recomputation.

A batch is a `TokenBatch` (jaxswe.packing; a mapping of its field names is accepted) of
[B, T] arrays: input_ids, positions, segment_ids (int32; 0 = padding, several trajectories may
share a row, each its own segment), loss_mask (float32); DAPO adds advantages, rollout_logprobs
and the trainer's old_logprobs (float32, per token), and corrects for the rollout policy inside
the jitted loss (`losses.off_policy_weights`). Every step:
- runs under the mesh's logical-axis rules (params/opt state sharded by `train_state_shardings`,
  rows over the `batch` axes, tokens over the `length` axes with context-parallel attention),
- splits the batch into `num_micro` micro-batches accumulated in a scan (each micro-batch takes
  an equal share of every device's rows, so no data moves); with `micro_rows` instead, a
  micro-batch is `micro_rows` rows per row shard and their count follows the batch's row count
  (token-budget batching: a step of short trajectories packs into few rows and runs few
  micro-batches; each distinct row count compiles once),
- normalizes the loss by the token count of the whole global batch, so the result is the same
  for any micro-batching or device count,
- donates the old state and returns (new_state, metrics): loss, grad_norm, lr, entropy, tokens and
  the loss's own aux (SFT: nll; DAPO: clip fractions, approx_kl, ratio mean/max).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxswe.errors import UserError
from jaxswe.losses import LossSettings, dapo_loss, off_policy_weights, sft_loss
from jaxswe.model.attention import mesh_attention
from jaxswe.model.config import Qwen2Config
from jaxswe.optim import micro_batched_value_and_grad
from jaxswe.packing import TokenBatch, step_fields
from jaxswe.train.logprobs import policy_logprobs
from jaxswe.train.state import TrainState, train_state_shardings
from sharding import context_size, replicated, use_rules
from sharding.logical import Rules, logical_to_spec


class TrainStepError(UserError):
    """A batch or setting the train step cannot use (shape, key, micro-batch split)."""


def batch_spec(rules: Rules) -> PartitionSpec:
    """PartitionSpec of every [B, T] batch leaf."""
    return logical_to_spec(("batch", "length"), rules)


def _batch_shards(mesh: Mesh, rules: Rules) -> int:
    entry = batch_spec(rules)[0]
    axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
    return math.prod(mesh.shape[a] for a in axes)


def check_batch(
    batch: TokenBatch, keys: tuple[str, ...], *, num_micro: int, row_shards: int, token_shards: int
) -> None:
    """Raise TrainStepError naming the first problem with a batch's fields, shapes or divisibility."""
    missing = [k for k in keys if getattr(batch, k) is None]
    if missing:
        raise TrainStepError(f"batch is missing {missing}; a batch needs {list(keys)}")
    shape = tuple(batch.input_ids.shape)
    for k in keys:
        if tuple(getattr(batch, k).shape) != shape or len(shape) != 2:
            raise TrainStepError(
                f"batch.{k} has shape {tuple(getattr(batch, k).shape)}; every leaf must be [B, T] = {shape}"
            )
    b, t = shape
    if b % (num_micro * row_shards):
        raise TrainStepError(
            f"batch of {b} rows cannot be split into {num_micro} micro-batches over {row_shards} row shards"
        )
    if t % (2 * token_shards) and token_shards > 1:
        raise TrainStepError(f"row length {t} must be divisible by 2 x context size ({2 * token_shards})")


def interleave_rows(batch: Any, num_micro: int, shards: int) -> Any:
    """Reorder rows so that contiguous micro-batch k holds rows k of every device's block.

    Rows [D blocks of M*b] -> [M groups of D*b]: each micro-batch then draws equally from every
    row shard and the split needs no communication. Row order does not change a summed loss.
    """

    def move(x):
        b = x.shape[0] // (shards * num_micro)
        x = x.reshape(shards, num_micro, b, *x.shape[1:]).swapaxes(0, 1)
        return x.reshape(shards * num_micro * b, *x.shape[3:])

    return jax.tree.map(move, batch)


def _entropy_mean(entropy_bt, mask_bt):
    """The mean entropy over trained tokens (a metric: no gradient)."""
    total = jnp.sum(jnp.where(mask_bt > 0, entropy_bt, 0.0)) / jnp.maximum(jnp.sum(mask_bt), 1.0)
    return jax.lax.stop_gradient(total)


class _Setup:
    """What every step of one (model, mesh, rules) shares: shardings and the log-prob function."""

    def __init__(
        self,
        config: Qwen2Config,
        optimizer,
        mesh: Mesh,
        rules: Rules,
        num_micro: int,
        context_attention: str,
        micro_rows: int | None = None,
    ):
        if num_micro < 1 or (micro_rows is not None and micro_rows < 1):
            raise TrainStepError(f"num_micro and micro_rows must be >= 1, got {num_micro}, {micro_rows}")
        self.config, self.mesh, self.rules, self.num_micro = config, mesh, rules, num_micro
        self.micro_rows = micro_rows
        self.context_n = context_size(mesh, rules)
        self.row_shards = _batch_shards(mesh, rules)
        # `model.attention`; flash kinds shard batch/heads explicitly, also without context parallelism
        self.attention_fn = mesh_attention(
            config.attention, config.attention_block, mesh, rules, context_attention
        )
        self.state_sh = (
            train_state_shardings(config, optimizer, mesh, rules) if optimizer is not None else None
        )
        self.batch_sh = NamedSharding(mesh, batch_spec(rules))

    def logprobs(self, params, mb):
        return policy_logprobs(
            params,
            self.config,
            mb.input_ids,
            mb.positions,
            mb.segment_ids,
            attention_fn=self.attention_fn,
            context_n=self.context_n,
        )

    def micro_count(self, rows: int) -> int:
        """Micro-batches of a batch of `rows` rows (fixed, or rows / (micro_rows x row shards))."""
        if self.micro_rows is None:
            return self.num_micro
        return max(rows // (self.micro_rows * self.row_shards), 1)

    @property
    def rows_multiple(self) -> int:
        return (self.micro_rows or self.num_micro) * self.row_shards

    def check(self, batch, keys):
        num_micro = self.micro_count(batch.input_ids.shape[0])
        check_batch(batch, keys, num_micro=num_micro, row_shards=self.row_shards, token_shards=self.context_n)


def _make_step(setup: _Setup, optimizer, keys, loss_fn, lr_schedule) -> Callable:
    """The checked step of `loss_fn(params, micro_batch, num_tokens) -> (loss, aux)` (aux with the
    micro-batch's mean `entropy`), averaged over the global token count and accumulated over
    micro-batches. Its `.check(batch)` validates a batch of its `.fields` and `.jitted` runs it."""

    def step(state: TrainState, batch: TokenBatch):
        batch = TokenBatch.of(batch)  # `.jitted` is also lowered on mappings of the fields
        with use_rules(setup.mesh, setup.rules):
            num_tokens = jnp.sum(batch.loss_mask.astype(jnp.float32))
            num_micro = setup.micro_count(batch.input_ids.shape[0])
            micro = interleave_rows(batch, num_micro, setup.row_shards)
            loss_of_micro = functools.partial(loss_fn, num_tokens=num_tokens)
            (loss, aux), grads = micro_batched_value_and_grad(loss_of_micro, num_micro)(state.params, micro)
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "tokens": num_tokens,
            "entropy": aux["entropy"],
            **{k: v for k, v in aux.items() if k not in ("entropy", "num_tokens")},
        }
        if lr_schedule is not None:
            metrics["lr"] = jnp.asarray(lr_schedule(state.step), jnp.float32)
        return TrainState(params=params, opt_state=opt_state, step=state.step + 1), metrics

    jitted = jax.jit(
        step,
        in_shardings=(setup.state_sh, setup.batch_sh),
        out_shardings=(setup.state_sh, replicated(setup.mesh)),
        donate_argnums=(0,),
    )

    def checked(state: TrainState, batch: TokenBatch | dict[str, Any]):
        batch = TokenBatch.of(batch).only(keys)
        setup.check(batch, keys)
        return jitted(state, batch)

    checked.jitted = jitted
    checked.check = lambda batch: setup.check(batch, keys)
    checked.fields = keys  # the batch fields the step reads
    checked.state_shardings = setup.state_sh
    checked.batch_sharding = setup.batch_sh
    checked.row_shards = setup.row_shards
    checked.rows_multiple = setup.rows_multiple
    return checked


def make_sft_step(
    model_cfg: Qwen2Config,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    rules: Rules,
    num_micro: int = 1,
    *,
    lr_schedule: optax.Schedule | None = None,
    context_attention: str = "ring",
    micro_rows: int | None = None,
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """step(state, batch) -> (state, metrics) minimizing the masked NLL of `loss_mask` tokens.

    The returned function checks the batch, then calls the jitted step (`.jitted`); its
    `.state_shardings` / `.batch_sharding` say where state and batch live.
    """
    setup = _Setup(model_cfg, optimizer, mesh, rules, num_micro, context_attention, micro_rows)

    def loss_fn(params, mb, num_tokens):
        logp, entropy, _ = setup.logprobs(params, mb)
        loss, aux = sft_loss(logp, mb.loss_mask, num_tokens=num_tokens)
        return loss, dict(aux, entropy=_entropy_mean(entropy, mb.loss_mask))

    return _make_step(setup, optimizer, step_fields("sft"), loss_fn, lr_schedule)


def make_dapo_step(
    model_cfg: Qwen2Config,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    rules: Rules,
    num_micro: int = 1,
    *,
    loss: LossSettings = LossSettings(),
    lr_schedule: optax.Schedule | None = None,
    context_attention: str = "ring",
    micro_rows: int | None = None,
) -> Callable[[TrainState, TokenBatch], tuple[TrainState, dict[str, jax.Array]]]:
    """step(state, batch) -> (state, metrics) of the DAPO clipped objective (per-token advantages),
    with `loss`'s settings (its entropy bonus when `entropy_coef` > 0). With `loss.off_policy`
    each token is weighted by `off_policy_weights(old_logprobs, rollout_logprobs, ...)`, computed
    here in the jitted loss (its metrics join the step's); without it the rollout log-probs are
    not read."""
    setup = _Setup(model_cfg, optimizer, mesh, rules, num_micro, context_attention, micro_rows)

    def loss_fn(params, mb, num_tokens):
        logp, entropy, _ = setup.logprobs(params, mb)
        chex.assert_equal_shape([logp, mb.old_logprobs, mb.advantages])
        weights, weight_aux = None, {}
        if loss.off_policy:
            weights, weight_aux = off_policy_weights(
                mb.old_logprobs,
                mb.rollout_logprobs,
                mb.loss_mask,
                mb.segment_ids,
                tis_cap=loss.tis_cap,
                sequence_mask=loss.sequence_mask,
                mask_threshold=loss.mask_threshold,
            )
        value, aux = dapo_loss(
            logp,
            mb.old_logprobs,
            mb.advantages,
            mb.loss_mask,
            eps_low=loss.eps_low,
            eps_high=loss.eps_high,
            num_tokens=num_tokens,
            token_weights=weights,
            entropy=entropy,
            entropy_coef=loss.entropy_coef,
            negative_weight=loss.negative_weight,
            negative_prob_floor=loss.negative_prob_floor,
        )
        return value, {**aux, **weight_aux, "entropy": _entropy_mean(entropy, mb.loss_mask)}

    return _make_step(setup, optimizer, step_fields("dapo", off_policy=loss.off_policy), loss_fn, lr_schedule)


def make_compute_logprobs(
    model_cfg: Qwen2Config,
    mesh: Mesh,
    rules: Rules,
    num_micro: int = 1,
    *,
    params_shardings: Any = None,
    context_attention: str = "ring",
    micro_rows: int | None = None,
) -> Callable[[Any, dict[str, jax.Array]], tuple[jax.Array, jax.Array, jax.Array]]:
    """fn(params, batch) -> (logprobs, entropy, surprisal variance) [B, T] float32, batch-sharded
    like the train steps.

    Runs `num_micro` micro-batches one after another (lax.map) to bound activation memory; used to
    recompute old log-probs before a DAPO update and to measure the rollout/trainer gap.
    """
    setup = _Setup(model_cfg, None, mesh, rules, num_micro, context_attention, micro_rows)
    keys = step_fields("logprobs")

    def run(params, batch):
        batch = TokenBatch.of(batch)
        with use_rules(mesh, rules):
            b = batch.input_ids.shape[0]
            num_micro = setup.micro_count(b)
            micro = interleave_rows(batch, num_micro, setup.row_shards)
            micro = jax.tree.map(lambda x: x.reshape(num_micro, b // num_micro, *x.shape[1:]), micro)
            stats = jax.lax.map(lambda mb: setup.logprobs(params, mb), micro)
            # undo the micro split and the row interleave
            undo = lambda x: interleave_rows({"x": x.reshape(b, -1)}, setup.row_shards, num_micro)["x"]
            return tuple(undo(x) for x in stats)

    jitted = jax.jit(
        run,
        in_shardings=(params_shardings, setup.batch_sh),
        out_shardings=(setup.batch_sh,) * 3,
    )

    def checked(params, batch: TokenBatch | dict[str, Any]):
        batch = TokenBatch.of(batch).only(keys)
        setup.check(batch, keys)
        return jitted(params, batch)

    checked.jitted = jitted
    return checked
