"""Before/after figure for the sampling-bias alarm, on the embedded sampler (no HTTP): a tiny Qwen2
with peaked next-token distributions (mean entropy ~1 nat) samples batches of completions, either
unbiased or with truncation applied whatever the request says; the trainer recomputes log-probs
and entropies. Prints, per setting, the rollout-vs-trainer log-prob gap KL (the only signal before
this alarm) and the alarm's statistic, and how many of N iterations trip the alarm.

    PYTHONPATH=$PWD python bench/sampling_bias.py --iterations 100
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxswe.model import get_preset, init_params, token_logprobs
from jaxswe.rollout.bias import BiasAlarm, logprob_gap, sampling_bias
from jaxswe.rollout.protocol import GenerateRequest
from jaxswe.rollout.sampler import Sampler
from jaxswe.rollout.types import SamplingParams

PROMPT, NEW, BATCH = 16, 16, 16  # one iteration: 16 completions of 16 tokens = 256 sampled tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=100)
    args = parser.parse_args()
    cfg = get_preset("tiny", vocab_size=64, remat="none", attention="dense")
    params = init_params(cfg, jax.random.key(0))
    params = dict(params, embed=params["embed"] * 3.0)  # peaked distributions, like a trained model
    sampler = Sampler(cfg, params, max_context=64, min_batch_bucket=BATCH, min_new_bucket=NEW)
    lp_fn = jax.jit(lambda ids: token_logprobs(params, cfg, ids, return_entropy=True, return_variance=True))
    alarm = BiasAlarm()
    settings = {"unbiased": {}, "top_k=20": {"top_k": 20}, "top_k=2": {"top_k": 2},
                "min_p=0.1": {"min_p": 0.1}, "top_p=0.8": {"top_p": 0.8}}  # fmt: skip
    rng = np.random.default_rng(0)
    for name, forced in settings.items():
        rows = []
        for _ in range(args.iterations):
            prompts = rng.integers(0, cfg.vocab_size, size=(BATCH, PROMPT))
            params_ = dataclasses.replace(SamplingParams(max_new_tokens=NEW), **forced)
            gens = sampler.generate([GenerateRequest(p.tolist(), params_, True) for p in prompts])
            ids = np.stack([np.concatenate([p, g.output_ids]) for p, g in zip(prompts, gens, strict=True)])
            lp, ent, var = (np.asarray(x) for x in lp_fn(jnp.asarray(ids)))
            mask = np.zeros(ids.shape, bool)
            mask[:, PROMPT:] = True
            rollout = np.zeros(ids.shape)
            rollout[:, PROMPT:] = [g.logprobs for g in gens]
            stats = sampling_bias(lp, ent, var, mask)
            rows.append((logprob_gap(rollout, lp, mask)["kl"], stats, alarm.fires(stats)))
        z = [s["sampling_bias_z"] for _, s, _ in rows]
        print(
            f"{name:10s} gap KL {np.mean([g for g, _, _ in rows]):.1e}  "
            f"bias {np.mean([s['sampling_bias_nats'] for _, s, _ in rows]):+.3f} nats/token  "
            f"z {np.mean(z):+.2f} (sd {np.std(z):.2f})  alarms {sum(a for *_, a in rows)}/{len(rows)}"
        )


if __name__ == "__main__":
    main()
