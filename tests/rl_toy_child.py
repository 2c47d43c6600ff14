"""Child process of the resume tests: RL on the toy env through `run_rl` (as `jaxswe rl` runs it).

usage: python rl_toy_child.py RUN_DIR ITERATIONS [--resume] [--kill-in-save STEP]
With --kill-in-save, the process SIGKILLs itself while checkpoint STEP is being written.
"""

import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAXSWE_TEST_CACHE"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

from rl_toy_helpers import toy_config, toy_env_factory, toy_policy  # noqa: E402

from jaxswe.rollout.backends import EmbeddedBackend  # noqa: E402
from jaxswe.rollout.engine import EmbeddedEngine  # noqa: E402
from jaxswe.rollout.sampler import Sampler  # noqa: E402
from jaxswe.run import checkpoint as ckpt_mod  # noqa: E402
from jaxswe.stages.context import StageBackend, StageContext  # noqa: E402
from jaxswe.stages.finish import finish_stage  # noqa: E402
from jaxswe.stages.rl import run_rl  # noqa: E402


def main() -> None:
    run_dir, iterations = Path(sys.argv[1]), int(sys.argv[2])
    resume = "--resume" in sys.argv
    if "--kill-in-save" in sys.argv:
        kill_step = int(sys.argv[sys.argv.index("--kill-in-save") + 1])
        real_save = ckpt_mod.Checkpoints.save

        def dying_save(self, step, items, meta, **kw):
            if step == kill_step:
                threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
                real_save(self, step, items, meta, **kw)
                time.sleep(60)  # save returned (its write may go on): die before anything after it runs
            real_save(self, step, items, meta, **kw)

        ckpt_mod.Checkpoints.save = dying_save
    every = int(sys.argv[sys.argv.index("--checkpoint-every") + 1]) if "--checkpoint-every" in sys.argv else 1
    # no TensorBoard: importing it (torch) is a third of a process start; trackers: test_metrics.py
    cfg = toy_config(rl={"iterations": iterations, "checkpoint_every": every}, logging={"backends": []})
    policy, tok = toy_policy(run_dir.parent / "policy", 2)
    sampler = Sampler(
        policy.model_cfg, policy.params, max_context=128, min_batch_bucket=64, min_prompt_bucket=128
    )
    ids = [f"toy-{i}" for i in range(8)]
    ctx = StageContext(
        cfg=cfg,
        stage_dir=run_dir,
        policy=policy,
        tokenizer=tok,
        task_ids=ids,
        eval_ids=ids,
        make_env=toy_env_factory(0, 2),
    )
    engine = EmbeddedBackend(EmbeddedEngine(sampler, max_batch=64), policy.model_cfg)
    ctx = replace(ctx, backend=StageBackend(cfg, policy, run_dir, opened=engine))
    finish_stage(ctx, *run_rl(ctx, resume=resume))


if __name__ == "__main__":
    main()
