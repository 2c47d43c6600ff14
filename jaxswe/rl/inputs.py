"""What the RL loop runs with: one value the RL stage builds from its stage context, so the loop
needs nothing of the stage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxswe.agent.episodes import EnvFactory
from jaxswe.config import RunConfig
from jaxswe.rollout.backends import Backend
from jaxswe.rollout.types import SamplingParams
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.train.trainer import Trainer


@dataclass(frozen=True)
class RLRun:
    """An RL stage's inputs: its config and directory, the tasks it trains on (after the task
    filters), how an episode's environment is built and sampled, the open backend serving the
    policy, the trainer holding it and the stage's checkpoints."""

    cfg: RunConfig
    stage_dir: Path
    tokenizer: Any
    task_ids: list[str]
    make_env: EnvFactory
    sampling: SamplingParams
    backend: Backend
    trainer: Trainer
    checkpoints: Checkpoints
