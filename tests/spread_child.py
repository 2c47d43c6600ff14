"""One process of tests/system/test_multiprocess.py's spread test: two iterations' `RolloutPump.take` at
k = 0 over an engine every process reaches (`Backend.spread`), on the toy game, with a stand-in
engine whose replies follow each request's sampling seed alone (as a seeded server's do).

usage: python spread_child.py OUT [COORDINATOR NUM_PROCESSES PROCESS_ID]

Writes OUT (JSON): the judged groups of each take (task, seed-made replies, rewards, kept) and the
sampling seeds this process's engine served."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace

from jaxswe.distributed import initialize

if len(sys.argv) == 5:
    initialize(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))

from helpers import ROOT  # noqa: E402

from jaxswe.config import load_config  # noqa: E402
from jaxswe.rl.problems import DataOrder  # noqa: E402
from jaxswe.rl.pump import RolloutPump  # noqa: E402
from jaxswe.rollout.types import Generation, SamplingParams  # noqa: E402
from jaxswe.stages.toy import toy_env_factory, toy_tasks, toy_tokenizer  # noqa: E402


class SeededEngine:
    """Replies `look`, `submit 0` or `submit 1`, chosen by the request's sampling seed."""

    def __init__(self, tok):
        self.tok, self.served = tok, []
        self.eot = tok.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, input_ids, params):
        self.served.append(params.sampling_seed)
        reply = random.Random(params.sampling_seed).choice(["look", "submit 0", "submit 1"])
        ids = self.tok.encode(reply, add_special_tokens=False) + [self.eot]
        return Generation(ids, [-1.0] * len(ids), "stop")


def main() -> None:
    cfg = load_config(ROOT / "configs" / "toy-rl.yaml", overrides=["rl.problems_per_iteration=3",
                      "rl.group_size=2", "rl.max_resample_rounds=2", "env.max_parallel=4"])  # fmt: skip
    tok = toy_tokenizer(cfg.env.toy_values)
    engine = SeededEngine(tok)
    ctx = SimpleNamespace(
        cfg=cfg, task_ids=[t.instance_id for t in toy_tasks(cfg)], make_env=toy_env_factory(cfg),
        backend=SimpleNamespace(engine=engine, spread=True), tokenizer=tok,
        sampling=SamplingParams(max_new_tokens=8),
    )  # fmt: skip

    async def takes():
        pump = RolloutPump(ctx, DataOrder())
        out = []
        for step in (1, 2):
            s = (await pump.take(step))[0].scored
            out.append([[g[0].task_id, [e.messages[2]["content"] for e in g], r, k]
                        for g, r, k in zip(s.groups, s.rewards, s.trained, strict=True)])  # fmt: skip
        return out, pump.spread

    groups, spread = asyncio.run(takes())
    Path(sys.argv[1]).write_text(json.dumps({"groups": groups, "served": engine.served, "spread": spread}))


if __name__ == "__main__":
    main()
