"""Episodes per minute on the built-in tasks, and where the time goes (model, sandbox, grading).

Two policies through the real agent loop (`jaxswe.agent.loop.run_episodes`) and real `SWEEnv`s:
  model:    a tiny random Qwen2 (preset "tiny", vocabulary of a tokenizer trained here) served by
            the embedded JAX sampler (`EmbeddedEngine`); its replies are noise, so episodes end
            at `--max-turns` (format errors, no grading). Measures model + sandbox time.
  scripted: the gold-patch commands (`gold_patch_to_commands`) then `submit`; no model. Measures
            sandbox commands and grading in a fresh sandbox.
Per-episode times are summed over episodes (they overlap when `--concurrency` > 1); the wall time
gives episodes per minute. The model policy runs once untimed first (JIT compilation).

    .venv/bin/python bench/bench_episodes.py --tasks 8 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def summarize(name: str, trajs: list, wall_s: float) -> dict:
    n = len(trajs)
    total = {
        k: sum(t.timings.get(k, 0.0) for t in trajs) for k in ("model_s", "env_s", "reward_s", "total_s")
    }
    ended: dict[str, int] = {}
    for t in trajs:
        ended[t.ended_by] = ended.get(t.ended_by, 0) + 1
    return {
        "policy": name,
        "episodes": n,
        "wall_s": round(wall_s, 2),
        "episodes_per_min": round(60 * n / wall_s, 1),
        "turns_per_episode": round(sum(t.num_turns for t in trajs) / n, 2),
        "generated_tokens": int(sum(sum(t.loss_mask) for t in trajs)),
        "mean_episode_s": round(total["total_s"] / n, 3),
        "share_model": round(total["model_s"] / total["total_s"], 3),
        "share_sandbox": round(total["env_s"] / total["total_s"], 3),
        "share_grading": round(total["reward_s"] / total["total_s"], 3),
        "mean_model_s": round(total["model_s"] / n, 3),
        "mean_sandbox_s": round(total["env_s"] / n, 3),
        "mean_grading_s": round(total["reward_s"] / n, 3),
        "ended_by": ended,
        "resolved": sum(t.reward == 1.0 for t in trajs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=0, help="first N built-in tasks (0: all)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--backend", default="local")
    ap.add_argument("--policy", choices=["model", "scripted", "both"], default="both")
    args = ap.parse_args()

    import jax

    from envs import load_tasks
    from jaxswe.agent.demos import command_reply, gold_patch_to_commands
    from jaxswe.agent.loop import run_episodes
    from jaxswe.agent.swe_env import SWEEnv
    from jaxswe.model.config import get_preset
    from jaxswe.model.params import init_params
    from jaxswe.rollout.engine import EmbeddedEngine
    from jaxswe.rollout.sampler import Sampler
    from jaxswe.rollout.types import Generation, SamplingParams
    from jaxswe.tokenizer import build_tokenizer

    tasks = load_tasks("builtin")
    tasks = tasks[: args.tasks] if args.tasks else tasks
    make_envs = lambda: [
        SWEEnv(t, backend=args.backend, window_lines=40, command_timeout_s=30) for t in tasks
    ]
    system = make_envs()[0].system_prompt
    tok = build_tokenizer(
        [system] + [t.problem_statement for t in tasks] + [t.patch for t in tasks], args.vocab_size
    )
    limits = {
        "max_turns": args.max_turns,
        "max_context_tokens": args.max_context,
        "concurrency": args.concurrency,
    }

    def timed(engine, sampling: SamplingParams) -> tuple[list, float]:
        t0 = time.perf_counter()
        trajs = asyncio.run(run_episodes(make_envs(), engine, tok, sampling=sampling, **limits))
        return trajs, time.perf_counter() - t0

    results = []
    if args.policy in ("model", "both"):
        cfg = get_preset("tiny", vocab_size=-(-len(tok) // 64) * 64, max_position_embeddings=args.max_context)
        sampler = Sampler(cfg, init_params(cfg, jax.random.key(0)), max_context=args.max_context, seed=0)
        engine = EmbeddedEngine(sampler, max_batch=args.concurrency)
        sampling = SamplingParams(max_new_tokens=args.max_new_tokens)
        _, compile_s = timed(engine, sampling)  # compiles the decode loop for the shapes the episodes hit
        trajs, wall = timed(engine, sampling)
        results.append({**summarize("model", trajs, wall), "warmup_s": round(compile_s, 1)})

    if args.policy in ("scripted", "both"):
        scripts = {
            t.problem_statement.strip(): [command_reply(c) for c in gold_patch_to_commands(t.patch)]
            + [command_reply("submit")]
            for t in tasks
        }
        eot = tok.convert_tokens_to_ids("<|im_end|>")

        class ScriptedRouter:
            async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
                text = tok.decode(input_ids)
                script = next(v for k, v in scripts.items() if k in text)
                ids = tok.encode(script.pop(0), add_special_tokens=False) + [eot]
                return Generation(ids, [0.0] * len(ids), "stop")

        trajs, wall = timed(ScriptedRouter(), SamplingParams(max_new_tokens=args.max_context // 2))
        results.append(summarize("scripted", trajs, wall))

    for row in results:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
