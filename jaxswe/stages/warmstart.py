"""Warm start (CPU demo only): the stand-in for a pretrained base model.

A tiny model has no skill, so the demo first builds a tokenizer on the tasks' own texts
(prompts, problem statements, observations and gold commands), initializes a small Qwen2-shaped
model, and trains it by SFT on scripted demonstrations: the gold patch of each task turned into
scaffold commands (`gold_patch_to_commands`) and played through the real agent loop, so the
tokens trained on are exactly the ones the agent produces and sees.

With `warmstart.decoys` each demonstration gets a decoy trained on equally often: the same edits
writing back the lines they would replace, then submit (a near miss: the tests still fail). The
model then starts with a real choice per task, as a pretrained model knows plausible wrong fixes
beside the right one, which sampling alone cannot settle and the reward can.
"""

from __future__ import annotations

import asyncio
import sys
from functools import partial
from pathlib import Path
from typing import Any

from jaxswe.agent.trajectory import Trajectory, save_jsonl
from jaxswe.config import RunConfig, SFTSection
from jaxswe.distributed import barrier, is_main, on_main_async
from jaxswe.errors import UserError
from jaxswe.policy import Policy, model_knobs, stage_model
from jaxswe.rollout.types import Generation, SamplingParams
from jaxswe.run import loops
from jaxswe.run.checkpoint import Checkpoints
from jaxswe.run.layout import StageDir
from jaxswe.run.loggers import stage_trackers
from jaxswe.run.metrics import MetricsLogger
from jaxswe.stages.context import StageContext
from jaxswe.stages.sft import run_sft
from jaxswe.train.trainer import Trainer


def scripted_replies(task: Any, *, decoy: bool = False) -> list[str]:
    """The assistant replies of the gold-command policy: each gold command, then submit. A decoy
    makes the same edits writing back the lines they replace (a near miss), then submits."""
    from jaxswe.agent.demos import command_reply, gold_patch_to_commands

    commands = gold_patch_to_commands(task.patch, write_back=decoy)
    return [command_reply(c) for c in commands] + [command_reply("submit")]


def has_decoy(task: Any) -> bool:
    """Whether the task's gold patch has a decoy: only edits of existing files do."""
    from jaxswe.agent.demos import DemoError, gold_patch_to_commands

    try:
        gold_patch_to_commands(task.patch, write_back=True)
    except DemoError:
        return False
    return True


class ScriptedEngine:
    """An Engine that answers each call with the next scripted reply (log-prob 0)."""

    def __init__(self, replies: list[str], tokenizer: Any):
        self._replies = list(replies)
        self._tokenizer = tokenizer

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        text = self._replies.pop(0) if self._replies else "```\nsubmit\n```"
        ids = self._tokenizer.encode(text, add_special_tokens=False) + [self._tokenizer.eos_token_id]
        return Generation(output_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")


CORPUS_WORKDIR = "/repo"  # stands for the sandbox's (randomly named) checkout in the corpus


def corpus_texts(cfg: RunConfig, tasks: list[Any], make_env: Any) -> list[str]:
    """Texts the demo tokenizer learns from: every message of a scripted text-level episode.

    The sandbox's random directory name is replaced by a fixed one, so the same tasks always
    give the same tokenizer (and the same seeded run the same model).
    """
    texts = []
    for task in tasks:
        env = make_env(task.instance_id)
        try:
            episode = [env.system_prompt, env.reset()]
            workdir = env.sandbox.workdir
            for reply in scripted_replies(task):
                step = env.step(reply)
                episode += [reply, step.observation]
                if step.done:
                    break
        finally:
            env.close()
        texts += [t.replace(workdir, CORPUS_WORKDIR) for t in episode]
    return texts


async def scripted_episodes(
    cfg: RunConfig, tasks: list[Any], make_env: Any, tokenizer: Any, *, decoy: bool = False
) -> list[Trajectory]:
    """The gold-command policy (or its decoy) through the real agent loop: token-exact demonstrations."""
    from jaxswe.agent.loop import run_episode

    sem = asyncio.Semaphore(cfg.env.max_parallel)

    async def one(task: Any) -> Trajectory:
        async with sem:
            traj = await run_episode(
                make_env(task.instance_id),
                ScriptedEngine(scripted_replies(task, decoy=decoy), tokenizer),
                tokenizer,
                # scripted replies are not sampled: only the context bounds their length
                sampling=SamplingParams(max_new_tokens=cfg.agent.max_context_tokens),
                max_turns=cfg.agent.max_turns,
                max_context_tokens=cfg.agent.max_context_tokens,
            )
        traj.task_id = task.instance_id
        return traj

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def build_policy(cfg: RunConfig, stage_dir: Path, tasks: list[Any], make_env: Any) -> Policy:
    """Tokenizer (built here unless model.tokenizer is set) and a random model of model.preset."""
    from jaxswe.model.config import get_preset
    from jaxswe.policy import init_sharded, load_tokenizer
    from jaxswe.tokenizer import build_tokenizer

    if not cfg.model.preset:
        raise UserError("the warmstart stage needs model.preset (it trains a model from scratch)")
    tok_dir = cfg.model.tokenizer
    if not tok_dir:
        tok_dir = str(StageDir(stage_dir).tokenizer)
        if is_main() and not (Path(tok_dir) / "tokenizer.json").is_file():
            texts = corpus_texts(cfg, tasks, make_env)
            build_tokenizer(texts, cfg.warmstart.vocab_size, tok_dir)
        barrier("warmstart tokenizer")
    tokenizer = load_tokenizer(tok_dir)
    vocab = -(-len(tokenizer) // 64) * 64
    model_cfg = get_preset(
        cfg.model.preset, **{**model_knobs(cfg), "vocab_size": vocab, **cfg.warmstart.model_overrides}
    )
    model_cfg = stage_model(model_cfg, cfg)
    return Policy(model_cfg, init_sharded(model_cfg, cfg.model.seed, cfg), tok_dir)


def run_warmstart(ctx: StageContext, *, resume: bool) -> tuple[dict[str, Any], Any]:
    """SFT on demonstrations; returns the stage summary and the trained params."""
    cfg, stage_dir = ctx.cfg, ctx.stage_dir
    ws = cfg.warmstart
    opt = cfg.optimizer.model_copy(update={"lr": ws.lr, "schedule": "constant", "warmup_steps": 0})
    trainer = Trainer(ctx.policy.model_cfg, ctx.policy.hand_over(), opt, mesh_cfg=cfg.mesh)
    ckpts = Checkpoints(StageDir(stage_dir).checkpoints, max_to_keep=1)
    if resume:
        restored = ckpts.restore_latest(trainer.state())
        if restored is not None:
            _, items, meta = restored
            trainer.load_state(items)
            return dict(meta["summary"]), trainer.params
    tasks = [ctx.tasks[i] for i in ctx.task_ids]
    demos = loops.run(on_main_async(lambda: scripted_episodes(cfg, tasks, ctx.make_env, ctx.tokenizer)))
    save_jsonl(StageDir(stage_dir).episodes("demonstrations"), demos)
    good = [e for e in demos if e.resolved]
    print(
        f"jaxswe warmstart: {len(good)}/{len(demos)} scripted demonstrations resolve their task",
        file=sys.stderr,
    )
    if not good:
        first = demos[0]
        raise UserError(
            f"no scripted demonstration resolved its task (e.g. {first.task_id}: ended by {first.ended_by}, "
            f"{first.infra_error or 'not resolved'}); check the task suite and agent.max_turns"
        )
    decoys = []
    if ws.decoys:  # a near miss beside each demonstration whose patch has one (edits only)
        solved = {e.task_id for e in good}
        decoy_tasks = [t for t in tasks if t.instance_id in solved and has_decoy(t)]
        play = partial(scripted_episodes, cfg, decoy_tasks, ctx.make_env, ctx.tokenizer, decoy=True)
        played = loops.run(on_main_async(play))
        save_jsonl(StageDir(stage_dir).episodes("decoys"), played)
        decoys = [e for e in played if not e.resolved and e.infra_error is None]
        print(
            f"jaxswe warmstart: {len(decoys)}/{len(played)} decoy demonstrations fail their task "
            f"({len(good) - len(decoy_tasks)} demonstrated tasks have no decoy)",
            file=sys.stderr,
        )
    sft = SFTSection(epochs=1e9, batch_size=ws.batch_size, max_steps=ws.steps, seq_len=cfg.sft.seq_len)
    metrics = MetricsLogger(stage_dir, trackers=stage_trackers(cfg, stage_dir, "warmstart"))
    sequences = [e.sft_sequence() for e in good + decoys]
    rows = run_sft(trainer, sequences, sft, metrics, seed=cfg.seed, desc="warmstart")
    metrics.close()
    summary = {
        "name": "warmstart",
        "note": "stand-in for a pretrained base model: SFT on scripted gold-command demonstrations"
        + (" and their decoys" if ws.decoys else ""),
        "demonstrations": len(good),
        "decoys": len(decoys),
        "demo_tokens_mean": sum(len(e.input_ids) for e in good) / len(good),
        "sft_steps": len(rows),
        "final_loss": rows[-1]["loss"],
        "checkpoint": str(ckpts.directory),
    }
    ckpts.save(1, trainer.state(), {"stage": "warmstart", "summary": summary})
    ckpts.close()
    return summary, trainer.params
