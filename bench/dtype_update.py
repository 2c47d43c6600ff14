"""Before/after figure for fp32 master weights: a random tiny Qwen2 saved as bf16 safetensors, loaded
by the stages' own code (`resolve_policy` + `Trainer`, as `jaxswe rft` does with the shipped
dtype defaults), N AdamW steps at the paper's RFT lr 5e-6; prints the dtypes of params and Adam
moments and the fraction of weights changed. Runs on any commit that has those two functions.

    PYTHONPATH=$PWD python bench/dtype_update.py [--steps 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from hf_helpers import VOCAB, all_vocab_batch, changed_fraction, reference_logprobs, write_bf16_checkpoint  # noqa: E402
from rl_toy_helpers import toy_tokenizer  # noqa: E402

from jaxswe.config import config_from_dict  # noqa: E402
from jaxswe.model import load_hf, token_logprobs  # noqa: E402
from jaxswe.stages.runtime import resolve_policy  # noqa: E402
from jaxswe.train.trainer import Trainer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    reference = write_bf16_checkpoint(tmp / "hf")
    config, params = load_hf(tmp / "hf", dtype=jnp.float32)  # the design contract
    ids = np.random.default_rng(1).integers(0, VOCAB, size=(2, 40))
    gap = np.abs(
        np.asarray(token_logprobs(params, config, jnp.asarray(ids))) - reference_logprobs(reference, ids)
    )
    print(
        f"load_hf(p, dtype=float32): compute {config.dtype}, "
        f"max |token_logprobs - transformers| {gap.max():.1e}"
    )
    toy_tokenizer(2, tmp / "tok")
    cfg = config_from_dict(
        {
            "model": {"path": str(tmp / "hf"), "tokenizer": str(tmp / "tok"), "remat": "none"},
            "optimizer": {"lr": 5e-6},
            "mesh": {"axes": {"fsdp": 1}},
        }  # fmt: skip
    )
    policy = resolve_policy(cfg)
    trainer = Trainer(policy.model_cfg, policy.params, cfg.optimizer, mesh_cfg=cfg.mesh)
    opt = jax.tree.leaves(trainer.state()["opt_state"]["optimizer"], is_leaf=lambda x: hasattr(x, "mu"))
    adam = next(s for s in opt if hasattr(s, "mu"))
    dtypes = lambda t: sorted({str(x.dtype) for x in jax.tree.leaves(t)})  # noqa: E731
    before = jax.device_get(trainer.params)
    for step in range(args.steps):
        trainer.sft_update(all_vocab_batch(trainer.rows_multiple, 256, seed=step))
    frac = changed_fraction(before, jax.device_get(trainer.params))
    after = jax.device_get(trainer.params)
    pairs = zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
    delta = np.mean([np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).mean() for a, b in pairs])
    print(
        f"params {dtypes(before)} mu {dtypes(adam.mu)} nu {dtypes(adam.nu)} compute "
        f"{policy.model_cfg.dtype}: {args.steps} steps at lr 5e-6 changed {100 * frac:.1f}% of the "
        f"weights (mean |delta| {delta:.2e})"
    )


if __name__ == "__main__":
    main()
