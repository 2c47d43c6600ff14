"""One process of the multi-process equality test: RFT then RL on the toy env through the stage
code `jaxswe rft` / `jaxswe rl` run (run_rft, run_rl_stage), on 8 CPU devices split over N
processes (gloo collectives); process 0 saves the final params to OUT/final.npz.

usage: python mp_toy_child.py OUT NUM_PROCESSES PROCESS_ID PORT
"""

import os
import sys
from pathlib import Path

out, num_processes, process_id, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // num_processes}"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, str(Path(__file__).parent))

from jaxswe import distributed  # noqa: E402

distributed.initialize(f"localhost:{port}", num_processes, process_id)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from rl_toy_helpers import toy_config, toy_context, toy_policy  # noqa: E402

from jaxswe.policy import load_policy  # noqa: E402
from jaxswe.stages.rft import run_rft  # noqa: E402
from jaxswe.stages.stages import run_rl_stage  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_compilation_cache_dir", os.environ["JAXSWE_TEST_CACHE"])
assert jax.device_count() == 8 and jax.process_count() == num_processes

# Requests carry per-request sampling seeds (rows keyed by seed and position), so both process
# counts sample the same tokens with the default batching. Seed 4: a DAPO step is taken in both RL
# iterations (the test asserts steps were taken; at seeds 1 and 3 no group is informative).
cfg = toy_config(
    seed=4,
    rft={"samples_per_task": 1},
    rl={
        "iterations": 2,
        "problems_per_iteration": 4,
        "group_size": 2,
        "trajectories_per_step": 8,
        "rows_per_step": 8,
    },
)
policy, tok = toy_policy(out / f"policy{process_id}", 2)
run_rft(toy_context(cfg, out / "rft", policy, tok, 2), resume=False)
rl_start = load_policy(out / "rft", cfg)
run_rl_stage(toy_context(cfg, out / "rl", rl_start, tok, 2, seed=4), history_from=None, resume=False)
final = load_policy(out / "rl", cfg).params
flat = {
    jax.tree_util.keystr(k): distributed.to_host(v) for k, v in jax.tree_util.tree_flatten_with_path(final)[0]
}
if distributed.is_main():
    np.savez(out / "final.npz", **flat)
