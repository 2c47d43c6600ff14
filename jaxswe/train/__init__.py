"""Sharded training: train state, SFT/DAPO steps with micro-batch accumulation, log-prob recomputation."""

from jaxswe.train.logprobs import policy_logprobs
from jaxswe.train.state import TrainState, init_train_state, train_state_shardings
from jaxswe.train.steps import TrainStepError, make_compute_logprobs, make_dapo_step, make_sft_step

__all__ = [
    "TrainState",
    "TrainStepError",
    "init_train_state",
    "make_compute_logprobs",
    "make_dapo_step",
    "make_sft_step",
    "policy_logprobs",
    "train_state_shardings",
]
