"""The episode driver's own CPU per episode-step: can one asyncio process drive 3,000 episodes?

    python bench/bench_driver.py [--episodes 32] [--concurrency 8 32] [--turns 8] [--backend docker]

The driver is what `jaxswe rl` runs on trainer process 0: `run_episodes` over the real agent loop
(`jaxswe.agent.loop`), a `RolloutClient` over HTTP, and real sandboxes (local bubblewrap, or
Docker containers) of the built-in tasks, each episode graded at its end. The model is a stand-in
HTTP server in another process that answers every turn at once (`ls -la`, then `submit` at the
last turn), so the driver, not the model, is the bottleneck. The sandboxes' and the server's CPU are other
processes'; the figure is this process's user + system CPU (getrusage) divided by the turns it
drove (one generate + one command each), the episodes' setup and grading included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def serve(port: int, script: dict) -> None:
    """The stand-in model: `ls -la` until the episode's last turn, then `submit` (turns counted
    from the chat's turn markers in the prompt); log-prob -0.5 per token."""
    from aiohttp import web

    async def generate(request):
        prompt = (await request.json())["input_ids"]
        turn = (prompt.count(script["turn_marker"]) - 2) // 2  # system, user, then one pair per turn
        reply_ids = script["submit"] if turn >= script["turns"] - 1 else script["look"]
        return web.json_response({"output_ids": reply_ids, "meta_info": {
            "output_token_logprobs": [[-0.5, t, None] for t in reply_ids], "finish_reason": {"type": "stop"},
            "weight_version": "0"}})  # fmt: skip

    async def health(request):
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--backend", choices=("local", "docker"), default="local")
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(int(args.serve[0]), json.loads(args.serve[1]))

    from envs import load_tasks
    from jaxswe.agent.demos import command_reply
    from jaxswe.agent.loop import run_episodes
    from jaxswe.agent.swe_env import SWEEnv
    from jaxswe.rollout.client import RolloutClient
    from jaxswe.rollout.types import SamplingParams
    from jaxswe.tokenizer import build_tokenizer

    tasks = load_tasks("builtin")
    tok = build_tokenizer([t.problem_statement for t in tasks] + [t.patch for t in tasks], 1000)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    script = {
        key: tok.encode(command_reply(cmd, "Next."), add_special_tokens=False) + [eot]
        for key, cmd in (("look", "ls -la"), ("submit", "submit"))
    }
    script |= {"turns": args.turns, "turn_marker": tok.convert_tokens_to_ids("<|im_start|>")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), json.dumps(script)])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        print("| episodes in flight | episodes | turns | driver CPU ms / turn | driver CPU s / episode "
              "| wall s | turns / wall s |")  # fmt: skip
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for conc in args.concurrency:
            envs = [SWEEnv(tasks[i % len(tasks)], backend=args.backend) for i in range(args.episodes)]

            async def drive(envs=envs, conc=conc):
                async with RolloutClient([url], max_retries=1) as client:
                    return await run_episodes(
                        envs, client, tok, sampling=SamplingParams(max_new_tokens=256),
                        max_turns=args.turns + 1, max_context_tokens=16384, concurrency=conc,
                    )  # fmt: skip

            cpu0, t0 = cpu_s(), time.perf_counter()
            trajs = asyncio.run(drive())
            cpu, wall = cpu_s() - cpu0, time.perf_counter() - t0
            turns = sum(t.num_turns for t in trajs)
            assert all(t.ended_by == "submitted" for t in trajs), {t.ended_by for t in trajs}
            print(f"| {conc} | {len(trajs)} | {turns} | {1000 * cpu / turns:.1f} | {cpu / len(trajs):.2f} "
                  f"| {wall:.1f} | {turns / wall:.1f} |", flush=True)  # fmt: skip
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
