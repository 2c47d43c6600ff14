"""A tiny policy that solves its tasks about half the time, for RL tests that must see a group train.

The demo's warm start (jaxswe/stages/warmstart.py) makes a tiny model solve tasks by SFT on
scripted gold-command demonstrations played through the real agent loop. Here every task gets two
such demonstrations, trained on equally often: the gold commands then `submit` (graded resolved),
and `submit` at once (graded unresolved: the empty patch fails the task's tests). The SFT optimum
splits the first reply's first differing token 50/50 and memorizes each branch after it, so at
temperature 1 the model resolves each task with probability about 1/2 once the branches are
learnt, however long it trains beyond that: a group of G episodes is informative unless all G
take the same branch (probability 2**(1-G) at an even split).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxswe.agent.demos import command_reply
from jaxswe.agent.loop import run_episode
from jaxswe.agent.trajectory import Trajectory
from jaxswe.config import OptimizerSection, RunConfig, SFTSection
from jaxswe.model.config import get_preset
from jaxswe.model.hf_io import save_hf
from jaxswe.model.params import init_params
from jaxswe.policy import load_tokenizer
from jaxswe.rollout.types import SamplingParams
from jaxswe.run.metrics import MetricsLogger
from jaxswe.stages.runtime import env_factory
from jaxswe.stages.sft import run_sft
from jaxswe.stages.warmstart import ScriptedEngine, corpus_texts, scripted_replies
from jaxswe.tokenizer import build_tokenizer
from jaxswe.train.trainer import Trainer

MODEL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


async def _demonstrations(
    cfg: RunConfig, tasks: list[Any], make_env: Any, tokenizer: Any
) -> list[Trajectory]:
    """Per task: the gold-command episode and the submit-at-once episode, through the agent loop."""
    scripts = [(t, scripted_replies(t)) for t in tasks] + [(t, [command_reply("submit")]) for t in tasks]

    async def one(task: Any, replies: list[str]) -> Trajectory:
        traj = await run_episode(
            make_env(task.instance_id),
            ScriptedEngine(replies, tokenizer),
            tokenizer,
            sampling=SamplingParams(max_new_tokens=cfg.agent.max_context_tokens),
            max_turns=cfg.agent.max_turns,
            max_context_tokens=cfg.agent.max_context_tokens,
        )
        return traj

    return list(await asyncio.gather(*(one(t, r) for t, r in scripts)))


def half_solving_model(
    cfg: RunConfig, tasks: list[Any], out: Path, *, steps: int = 100, lr: float = 1e-2, vocab_size: int = 1024
) -> dict[str, Any]:
    """Build the tokenizer and train the half-solving model into the Hugging Face dir `out`, for the
    agent settings of `cfg` (prompts, context); returns what the demonstrations and SFT gave."""
    make_env = env_factory(cfg, tasks)
    build_tokenizer(corpus_texts(cfg, tasks, make_env), vocab_size, out)
    tokenizer = load_tokenizer(out)
    demos = asyncio.run(_demonstrations(cfg, tasks, make_env, tokenizer))
    n = len(tasks)
    assert [e.resolved for e in demos] == [True] * n + [False] * n, [(e.task_id, e.ended_by) for e in demos]
    model_cfg = get_preset("tiny", vocab_size=-(-len(tokenizer) // 64) * 64, attention="dense", **MODEL)
    opt = OptimizerSection(lr=lr, weight_decay=0.0, schedule="constant", warmup_steps=0)
    trainer = Trainer(model_cfg, init_params(model_cfg, jax.random.key(cfg.seed)), opt)
    sft = SFTSection(epochs=1e9, batch_size=len(demos), max_steps=steps, seq_len=cfg.agent.max_context_tokens)
    metrics = MetricsLogger(out.with_name(out.name + "_sft"))
    rows = run_sft(
        trainer, [e.sft_sequence() for e in demos], sft, metrics, seed=cfg.seed, desc="half-solver"
    )
    metrics.close()
    save_hf(out, model_cfg, trainer.params, dtype="float32")
    return {"final_loss": rows[-1]["loss"], "demo_tokens": [len(e.input_ids) for e in demos]}


def branch_probability(model_dir: Path, episode_ids: list[int], mask: list[int]) -> float:
    """exp(sum of the model's log-probs of an episode's trained tokens): how likely the policy is to
    replay that demonstration exactly."""
    from jaxswe.model.hf_io import load_hf
    from jaxswe.model.logprobs import token_logprobs

    cfg, params = load_hf(model_dir, dtype="float32")
    lp = np.asarray(token_logprobs(params, cfg, np.asarray([episode_ids], np.int32)))[0]
    return float(np.exp((lp * np.asarray(mask)).sum()))
