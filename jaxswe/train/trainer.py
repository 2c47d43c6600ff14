"""The trainer of a stage: a sharded TrainState and the jitted steps of `jaxswe.train`.

One `Trainer` serves SFT (warm start, RFT) and DAPO (RL) with the same sharded steps a 72B run
uses: params and AdamW state laid out by the mesh's logical-axis rules, micro-batches accumulated
inside the step, and the loss normalized by the global count of trained tokens. Without a mesh
config it runs on one device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxswe.distributed import check_same_on_every_process, to_host
from jaxswe.errors import UserError
from jaxswe.losses import LossSettings
from jaxswe.model.params import param_logical_axes
from jaxswe.optim import make_optimizer, make_schedule
from jaxswe.packing import TokenBatch, step_fields
from jaxswe.train import (
    TrainState,
    init_train_state,
    make_compute_logprobs,
    make_dapo_step,
    make_sft_step,
)
from jaxswe.train.state import abstract_params
from sharding import make_mesh, make_rules, param_shardings

if TYPE_CHECKING:  # annotations only: the steps import without pydantic (GPU images, bench/gpu/check.py)
    from jaxswe.config import MeshSection, OptimizerSection

Batch = TokenBatch | dict[str, np.ndarray]


def trainer_mesh(mesh_cfg: MeshSection | None) -> tuple[Any, Any, str]:
    """(mesh, rules, context attention) a Trainer of `mesh_cfg` runs on (None: one device)."""
    if mesh_cfg is None:
        return make_mesh({"fsdp": 1}, jax.devices()[:1]), make_rules(), "ring"
    devices = jax.devices()
    if mesh_cfg.devices is not None:
        if jax.process_count() > 1 or mesh_cfg.devices > len(devices):
            raise UserError(
                f"mesh.devices {mesh_cfg.devices}: needs one process with at least that many devices "
                f"({jax.process_count()} processes, {len(devices)} devices)"
            )
        devices = devices[: mesh_cfg.devices]
    return make_mesh(mesh_cfg.axes, devices), make_rules(mesh_cfg.rules), mesh_cfg.context_attention


def params_placement(model_cfg: Any, mesh_cfg: MeshSection | None) -> Any:
    """The NamedSharding of every param in a Trainer of `mesh_cfg`: where loading and restoring
    put each array directly, so the model is never whole on one device."""
    mesh, rules, _ = trainer_mesh(mesh_cfg)
    return param_shardings(mesh, rules, param_logical_axes(model_cfg), abstract_params(model_cfg))


class TrainerSteps(NamedTuple):
    """The optimizer and jitted programs of a Trainer (`make_steps`)."""

    optimizer: optax.GradientTransformation
    sft: Any
    dapo: Any
    logprobs: Any


def make_steps(
    model_cfg: Any, opt_cfg: OptimizerSection, mesh: Any, rules: Any, attention: str, loss: LossSettings
) -> TrainerSteps:
    """The SFT and DAPO steps and the old-log-prob recompute pass a Trainer runs on `mesh`, and
    `jaxswe.plan.compiled_memory` compiles for a config with abstract inputs: one construction for
    both. The recompute pass splits rows like the train step, so it needs no more activation
    memory."""
    optimizer = make_optimizer(opt_cfg)
    common = dict(
        num_micro=opt_cfg.micro_batches,
        micro_rows=opt_cfg.micro_batch_rows,
        lr_schedule=make_schedule(opt_cfg),
        context_attention=attention,
    )
    sft = make_sft_step(model_cfg, optimizer, mesh, rules, **common)
    dapo = make_dapo_step(model_cfg, optimizer, mesh, rules, loss=loss, **common)
    logprobs = make_compute_logprobs(
        model_cfg,
        mesh,
        rules,
        opt_cfg.micro_batches,
        micro_rows=opt_cfg.micro_batch_rows,
        params_shardings=sft.state_shardings.params,
        context_attention=attention,
    )
    return TrainerSteps(optimizer, sft, dapo, logprobs)


class Trainer:
    """Params + AdamW state + the sharded SFT/DAPO steps and log-prob recomputation."""

    def __init__(
        self,
        model_cfg: Any,
        params: Any,
        opt_cfg: OptimizerSection,
        *,
        loss: LossSettings = LossSettings(),
        mesh_cfg: MeshSection | None = None,
    ):
        self.model_cfg = model_cfg
        self.opt_cfg = opt_cfg
        self.mesh, self.rules, attention = trainer_mesh(mesh_cfg)
        self.optimizer, self._sft, self._dapo, self._lp = make_steps(
            model_cfg, opt_cfg, self.mesh, self.rules, attention, loss
        )
        self._shardings: TrainState = self._sft.state_shardings
        # params restored from a checkpoint sit committed on one device: lay them out first; the
        # masters (and so both AdamW moments) are model_cfg.param_dtype whatever the checkpoint's
        params = jax.device_put(params, self._shardings.params)
        master = jnp.dtype(model_cfg.param_dtype)
        params = jax.tree.map(lambda p: p.astype(master), params)
        self._state = init_train_state(params, self.optimizer, self._shardings)

    @property
    def params(self) -> Any:
        return self._state.params

    @property
    def rows_multiple(self) -> int:
        """Row count every batch must be a multiple of (micro-batches, or rows per micro-batch, x row
        shards)."""
        return self._sft.rows_multiple

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds of the trainer: params, and the optimizer state with its step."""
        return {
            "params": self._state.params,
            "opt_state": {"optimizer": self._state.opt_state, "step": self._state.step},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Adopt a restored `state()`, laid out by this trainer's shardings."""
        opt = state["opt_state"]
        restored = TrainState(params=state["params"], opt_state=opt["optimizer"], step=jnp.int32(opt["step"]))
        self._state = jax.device_put(restored, self._shardings)

    def _put(self, batch: Batch) -> TokenBatch:
        batch = TokenBatch.of(batch)
        check_same_on_every_process(list(batch), "a training batch")
        put = lambda x: None if x is None else jax.device_put(np.asarray(x), self._sft.batch_sharding)
        return TokenBatch(*(put(x) for x in batch))

    def logprobs(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Trainer log-probs, entropies and surprisal variances [B, T] of the batch's tokens (no
        update)."""
        stats = self._lp(self.params, self._put(TokenBatch.of(batch).only(step_fields("logprobs"))))
        return tuple(to_host(x).astype(np.float32) for x in stats)

    def sft_update(self, batch: Batch) -> dict[str, float]:
        batch = self._put(TokenBatch.of(batch).only(self._sft.fields))
        self._sft.check(batch)
        self._state, out = self._sft.jitted(self._state, batch)
        return {k: float(v) for k, v in out.items()}

    def dapo_update(self, batch: Batch) -> dict[str, float]:
        """One optimizer step of the DAPO loss; `batch` holds advantages, the rollout's and the
        trainer's old log-probs (the off-policy correction is computed in the jitted loss)."""
        batch = self._put(TokenBatch.of(batch).only(self._dapo.fields))
        self._dapo.check(batch)
        self._state, out = self._dapo.jitted(self._state, batch)
        return {k: float(v) for k, v in out.items()}
