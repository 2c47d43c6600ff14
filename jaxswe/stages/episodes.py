"""Episodes as the stages keep them: token-exact records of one agent run, saved as JSONL."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jaxswe.data.packing import Sequence
from jaxswe.distributed import is_main


@dataclass(frozen=True)
class Episode:
    """One finished agent run on one task, with everything training and metrics need."""

    task_id: str
    input_ids: list[int]
    loss_mask: list[int]  # 1 on the assistant's generated tokens (RL)
    sft_mask: list[int]  # loss_mask without turns that broke the action format (RFT)
    rollout_logprobs: list[float]  # rollout-engine log-prob per token (0 where not generated)
    num_turns: int
    ended_by: str  # submitted | max_turns | context | error
    resolved: bool
    infra_error: str | None = None  # set when the infrastructure failed: excluded, never scored 0
    grading_s: float = 0.0  # time spent grading the submission
    policy_versions: list[int] = field(default_factory=list)  # per token; -1 where not sampled
    tampered: bool = False  # grading flagged the patch as tampering with the tests (reward 0)

    @property
    def num_generated(self) -> int:
        return int(sum(self.loss_mask))

    def rl_sequence(self, advantage: float) -> Sequence:
        return Sequence(
            np.asarray(self.input_ids, np.int32),
            np.asarray(self.loss_mask, np.float32),
            rollout_logprobs=np.asarray(self.rollout_logprobs, np.float32),
            advantage=advantage,
            policy_versions=np.asarray(self.policy_versions, np.int32) if self.policy_versions else None,
        )

    def sft_sequence(self) -> Sequence:
        return Sequence(np.asarray(self.input_ids, np.int32), np.asarray(self.sft_mask, np.float32))


def from_trajectory(task_id: str, traj: Any) -> Episode:
    """Convert the agent loop's Trajectory (jaxswe.agent.trajectory) into an Episode. When the
    episode was sampled with a prompt it is not trained on (`trained_prompt_ids` in its metadata:
    a one-shot demonstration), the episode holds the trained prompt followed by the same turns."""
    infra = traj.infra_error or ("episode ended by error" if traj.is_infra_failure else None)
    prompt = traj.metadata.get("trained_prompt_ids")
    cut, head = (traj.prompt_len, [int(t) for t in prompt]) if prompt is not None else (0, [])
    pad = [0] * len(head)
    return Episode(
        task_id=task_id,
        input_ids=head + [int(t) for t in traj.input_ids[cut:]],
        loss_mask=pad + [int(x) for x in traj.loss_mask[cut:]],
        sft_mask=pad + [int(x) for x in traj.rft_loss_mask()[cut:]],
        rollout_logprobs=[0.0] * len(head) + [float(x) for x in traj.rollout_logprobs[cut:]],
        num_turns=int(traj.num_turns),
        ended_by=str(traj.ended_by),
        resolved=infra is None and (traj.reward or 0.0) >= 1.0,
        infra_error=str(infra) if infra else None,
        grading_s=float(traj.metadata.get("reward_s", 0.0)),
        policy_versions=[int(v) for v in traj.policy_versions],
        tampered=bool(traj.metadata.get("tamper")),
    )


def save_episodes(path: str | Path, episodes: list[Episode], extra: list[dict] | None = None) -> None:
    """Write one JSON object per episode (atomically: a killed write leaves the old file); process 0
    only."""
    if not is_main():
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for i, ep in enumerate(episodes):
            row = asdict(ep)
            if extra:
                row.update(extra[i])
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def load_episodes(path: str | Path) -> list[Episode]:
    fields = set(Episode.__dataclass_fields__)
    out = []
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        out.append(Episode(**{k: v for k, v in row.items() if k in fields}))
    return out
