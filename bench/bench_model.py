"""Model benchmarks: log-prob throughput vs transformers+torch (CPU), and token_logprobs memory vs T.

Run: .venv/bin/python bench/bench_model.py [--repeats 3] [--skip-memory]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxswe.model import count_params, get_preset, init_params, load_hf, save_hf, token_logprobs  # noqa: E402

BENCH_CONFIG = get_preset(
    "tiny", vocab_size=32000, hidden_size=256, intermediate_size=1024, num_layers=4, num_heads=4,
    num_kv_heads=2, tie_word_embeddings=False, dtype="float32", remat="none", attention_block=256,
    logprob_chunk=256,
)  # fmt: skip


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def throughput(batch: int, length: int, repeats: int) -> dict[str, float]:
    import torch
    import transformers

    params = init_params(BENCH_CONFIG, jax.random.key(0))
    ids = np.random.default_rng(0).integers(0, BENCH_CONFIG.vocab_size, size=(batch, length))
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(tmp, BENCH_CONFIG, params, dtype="float32")
        model = transformers.Qwen2ForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        config, params = load_hf(tmp)
    config = BENCH_CONFIG
    fn = jax.jit(lambda p, i: token_logprobs(p, config, i))
    ids_j = jnp.asarray(ids)
    fn(params, ids_j).block_until_ready()
    jax_s = best_of(lambda: fn(params, ids_j).block_until_ready(), repeats)

    ids_t = torch.tensor(ids)

    def torch_logprobs():
        with torch.no_grad():
            logits = model(ids_t).logits
            return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids_t[:, 1:, None])

    torch_logprobs()
    torch_s = best_of(torch_logprobs, repeats)
    tokens = batch * length
    return {"jax_tok_s": tokens / jax_s, "torch_tok_s": tokens / torch_s, "speedup": torch_s / jax_s}


def memory(lengths: list[int]) -> dict[int, float]:
    """Compiled temp memory (MiB) of jitted token_logprobs for a small config at each T."""
    config = get_preset("tiny", vocab_size=32000, hidden_size=256, intermediate_size=1024, num_layers=4,
                        num_heads=4, num_kv_heads=2, attention_block=512, logprob_chunk=1024)  # fmt: skip
    params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    out = {}
    for t in lengths:
        ids = jax.ShapeDtypeStruct((1, t), jnp.int32)
        compiled = jax.jit(lambda p, i: token_logprobs(p, config, i)).lower(params, ids).compile()
        out[t] = compiled.memory_analysis().temp_size_in_bytes / 2**20
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    print(f"config: {count_params(BENCH_CONFIG) / 1e6:.1f}M params, batch {args.batch} x {args.length}, "
          f"{jax.devices()[0].platform}")  # fmt: skip
    result = throughput(args.batch, args.length, args.repeats)
    print(f"jax  token_logprobs: {result['jax_tok_s']:.0f} tok/s")
    print(f"torch (transformers): {result['torch_tok_s']:.0f} tok/s")
    print(f"speedup: {result['speedup']:.2f}x")
    if not args.skip_memory:
        mem = memory([4096, 16384, 32768])
        base_t, base = 4096, mem[4096]
        for t, mib in mem.items():
            print(f"T={t:6d}: temp {mib:8.1f} MiB  ({mib / base:.2f}x of T=4K, T ratio {t / base_t:.0f}x)")


if __name__ == "__main__":
    main()
