"""Decode throughput: the embedded JAX sampler vs transformers `generate` (KV cache), same model.

A random Qwen2 model is built with transformers, saved, and loaded by both sides. Both sample at
temperature 1 with no stop token, so every row decodes exactly `--new-tokens` tokens. Reported:
generated tokens per second (batch * new tokens / wall time), best of `--repeats` after one
warm-up (JAX compile excluded; the compile time is reported separately). The JAX sampler runs
twice: decoding in chunks of `--decode-chunk` steps (the default; requests can be aborted
between chunks) and in one chunk (the whole budget in one compiled call), to price the chunks.

    .venv/bin/python bench/bench_sampler.py --batch 8 --new-tokens 256
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--decode-chunk", type=int, default=32, help="decode steps between abort checks")
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers

    from jaxswe.rollout.protocol import GenerateRequest
    from jaxswe.rollout.sampler import Sampler
    from jaxswe.rollout.types import SamplingParams
    from jaxswe.rollout.weights import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    hf_cfg = transformers.Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    hf_model = transformers.Qwen2ForCausalLM(hf_cfg).eval()
    prompts = np.random.default_rng(0).integers(0, args.vocab, size=(args.batch, args.prompt_len))
    n_tokens = args.batch * args.new_tokens

    def hf_run() -> None:
        with torch.no_grad():
            out = hf_model.generate(
                torch.tensor(prompts), attention_mask=torch.ones(prompts.shape, dtype=torch.long),
                max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=True,
                temperature=1.0, top_k=0, top_p=1.0, use_cache=True, pad_token_id=0, eos_token_id=None,
            )  # fmt: skip
        assert out.shape[1] == args.prompt_len + args.new_tokens

    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp, safe_serialization=True)
        cfg, params = load_model(tmp)
    reqs = [GenerateRequest(p.tolist(), SamplingParams(max_new_tokens=args.new_tokens)) for p in prompts]

    def jax_runner(decode_chunk: int):
        sampler = Sampler(cfg, params, seed=0, decode_chunk=decode_chunk)

        def run() -> None:
            gens = sampler.generate(reqs)
            assert all(len(g.output_ids) == args.new_tokens for g in gens)

        return run

    def best(fn) -> tuple[float, float]:
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times), first

    chunked, one_chunk = jax_runner(args.decode_chunk), jax_runner(args.new_tokens)
    t0 = time.perf_counter()
    chunked()
    jax_first = time.perf_counter() - t0
    one_chunk()
    times: dict[str, list[float]] = {"chunked": [], "one": []}
    for _ in range(args.repeats):  # interleaved, so load changes hit both alike
        for name, fn in (("chunked", chunked), ("one", one_chunk)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    jax_s, one_s = min(times["chunked"]), min(times["one"])
    print(f"jax: {n_tokens / jax_s:.1f} tokens/s (first call {jax_first:.1f}s)", flush=True)
    print(f"jax, one chunk: {n_tokens / one_s:.1f} tokens/s", flush=True)
    hf_s, _ = best(hf_run)
    print(f"transformers: {n_tokens / hf_s:.1f} tokens/s", flush=True)
    result = {
        "model": {k: getattr(args, k) for k in ("hidden", "layers", "heads", "kv_heads", "vocab")},
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "jax_tokens_per_s": round(n_tokens / jax_s, 1),
        "jax_first_call_s": round(jax_first, 2),
        "decode_chunk": args.decode_chunk,
        "jax_one_chunk_tokens_per_s": round(n_tokens / one_s, 1),
        "chunked_vs_one_chunk": round(one_s / jax_s, 3),
        "transformers_tokens_per_s": round(n_tokens / hf_s, 1),
        "speedup": round(hf_s / jax_s, 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
