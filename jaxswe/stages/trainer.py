"""The trainer state of a stage (params, optimizer state, step) and its jitted updates.

One `Trainer` serves SFT (warm start, RFT) and DAPO (RL). Every update normalizes its loss by
the global count of trained tokens of the optimizer step, so splitting the step into
micro-batches (`optimizer.micro_batches`) leaves the gradient unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxswe.config import OptimizerSection
from jaxswe.losses import dapo_loss, sft_loss
from jaxswe.model.logprobs import token_logprobs
from jaxswe.optim import accumulate_gradients, make_optimizer

Batch = dict[str, np.ndarray]


def _logprobs(params: Any, batch: Batch, *, cfg: Any, entropy: bool) -> Any:
    return token_logprobs(
        params,
        cfg,
        batch["input_ids"],
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
        return_entropy=entropy,
    )


def _sft_loss_fn(params, batch, num_tokens, *, cfg):
    lp_bt = _logprobs(params, batch, cfg=cfg, entropy=False)
    return sft_loss(lp_bt, batch["loss_mask"], num_tokens=num_tokens)


def _dapo_loss_fn(params, batch, num_tokens, *, cfg, eps_low, eps_high):
    lp_bt, ent_bt = _logprobs(params, batch, cfg=cfg, entropy=True)
    loss, aux = dapo_loss(
        lp_bt,
        batch["old_logprobs"],
        batch["advantages"],
        batch["loss_mask"],
        eps_low=eps_low,
        eps_high=eps_high,
        num_tokens=num_tokens,
        token_weights=batch["token_weights"],
    )
    mask = batch["loss_mask"]
    aux["entropy"] = jnp.sum(ent_bt * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, aux


def _update(params, opt_state, batch, *, loss_fn, optimizer, num_micro):
    chex.assert_rank(batch["input_ids"], 2)
    num_tokens = jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0)
    fn = functools.partial(loss_fn, num_tokens=num_tokens)
    loss, aux, grads = accumulate_gradients(lambda p, b: fn(p, b), params, batch, num_micro)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}


class Trainer:
    """Params + AdamW state + the jitted SFT/DAPO updates and log-prob recomputation."""

    def __init__(
        self,
        model_cfg: Any,
        params: Any,
        opt_cfg: OptimizerSection,
        *,
        eps_low: float = 0.2,
        eps_high: float = 0.28,
        opt_state: Any = None,
    ):
        self.model_cfg = model_cfg
        self.opt_cfg = opt_cfg
        self.optimizer = make_optimizer(opt_cfg)
        self.params = params
        self.opt_state = self.optimizer.init(params) if opt_state is None else opt_state
        micro = opt_cfg.micro_batches
        common = {"optimizer": self.optimizer, "num_micro": micro}
        self._sft = jax.jit(
            functools.partial(_update, loss_fn=functools.partial(_sft_loss_fn, cfg=model_cfg), **common),
            donate_argnums=(0, 1),
        )
        dapo_fn = functools.partial(_dapo_loss_fn, cfg=model_cfg, eps_low=eps_low, eps_high=eps_high)
        self._dapo = jax.jit(functools.partial(_update, loss_fn=dapo_fn, **common), donate_argnums=(0, 1))
        self._lp = jax.jit(functools.partial(_logprobs, cfg=model_cfg, entropy=True))

    @property
    def rows_multiple(self) -> int:
        """Row count every batch must be a multiple of (the micro-batch split)."""
        return self.opt_cfg.micro_batches

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds of the trainer."""
        return {"params": self.params, "opt_state": self.opt_state}

    def load_state(self, state: dict[str, Any]) -> None:
        self.params, self.opt_state = state["params"], state["opt_state"]

    def logprobs(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """Trainer log-probs and entropies [B, T] of the batch's tokens (no update)."""
        keys = ("input_ids", "positions", "segment_ids")
        lp_bt, ent_bt = self._lp(self.params, {k: jnp.asarray(batch[k]) for k in keys})
        return np.asarray(lp_bt, np.float32), np.asarray(ent_bt, np.float32)

    def sft_update(self, batch: Batch) -> dict[str, float]:
        keys = ("input_ids", "positions", "segment_ids", "loss_mask")
        self.params, self.opt_state, out = self._sft(
            self.params, self.opt_state, {k: jnp.asarray(batch[k]) for k in keys}
        )
        return {k: float(v) for k, v in out.items()}

    def dapo_update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step of the DAPO loss; `batch` needs old_logprobs, advantages and
        (optionally) token_weights, all [B, T]."""
        arrays = {k: jnp.asarray(v) for k, v in batch.items()}
        arrays.setdefault("token_weights", jnp.ones_like(arrays["loss_mask"]))
        self.params, self.opt_state, out = self._dapo(self.params, self.opt_state, arrays)
        return {k: float(v) for k, v in out.items()}
