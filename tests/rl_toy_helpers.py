"""Shared by the RL tests: a word-level ChatML tokenizer for the toy env and a tiny RL setup."""

from __future__ import annotations

import random
from pathlib import Path

from envs.toy import ToyEnv
from jaxswe.stages.toy import toy_tokenizer  # noqa: F401 (the RL tests' tokenizer)


def toy_env_factory(seed: int, num_values: int):
    """(task id, episode seed) -> a fresh ToyEnv drawn from (seed, task id, episode seed), so a run
    replays exactly. Invalid replies never end the episode early (the turn limit does), so they
    count as failures, not infra errors."""

    def make(task_id: str, episode_seed: int | None = None) -> ToyEnv:
        env_seed = random.Random(f"{seed}/{task_id}/{episode_seed}").getrandbits(63)
        return ToyEnv(env_seed, num_values, max_format_errors=100)

    return make


def toy_config(**sections):
    """A RunConfig for RL on the toy env: at most two sampled tokens per turn, tiny batches."""
    from jaxswe.config import config_from_dict

    base = {
        "seed": 0,
        "optimizer": {"lr": 5e-3, "weight_decay": 0.0},
        "rollout": {"max_new_tokens": 2, "max_batch": 64},
        "agent": {"max_turns": 5, "max_context_tokens": 128},
        "env": {"max_parallel": 64},
        "sft": {"batch_size": 8, "seq_len": 128, "max_steps": 2},
        "rl": {
            "iterations": 2,
            "problems_per_iteration": 8,
            "group_size": 8,
            "trajectories_per_step": 32,
            "seq_len": 128,
            "rows_per_step": 16,
            "turn_penalty_threshold": 4,
        },
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values} if isinstance(values, dict) else values
    return config_from_dict(base)


def toy_policy(
    tmp_dir: Path, num_values: int, seed: int = 0, *, single_token_actions: bool = False, **model_changes
):
    """A random tiny Qwen2 over the toy tokenizer (saved under tmp_dir/tokenizer); `model_changes`
    override fields of the `tiny` preset."""
    import jax

    from jaxswe.model.config import get_preset
    from jaxswe.model.params import init_params
    from jaxswe.policy import Policy

    tok = toy_tokenizer(num_values, tmp_dir / "tokenizer", single_token_actions=single_token_actions)
    model_cfg = get_preset("tiny", vocab_size=len(tok), attention="dense", **model_changes)
    return Policy(model_cfg, init_params(model_cfg, jax.random.key(seed)), str(tmp_dir / "tokenizer")), tok


def toy_context(
    cfg, stage_dir: Path, policy, tokenizer, num_values: int, *, num_tasks: int = 8, seed: int = 0
):
    """An opened stage on the toy env (what `open_stage` builds for SWE tasks), with its own
    `Policy` holding `policy`'s params: the stage's trainer takes them over from it."""
    from dataclasses import replace

    from jaxswe.policy import write_model_file
    from jaxswe.stages.context import StageContext
    from jaxswe.stages.stage_io import prepare_stage_dir

    prepare_stage_dir(stage_dir, cfg)
    write_model_file(stage_dir, policy)
    ids = [f"toy-{i}" for i in range(num_tasks)]
    return StageContext(
        cfg, stage_dir, replace(policy), tokenizer, ids, ids, toy_env_factory(seed, num_values)
    )
