"""Per-device compiled cost of log-probs under context parallelism (compile only, 8 fake CPU devices).

Prints, for the recompute pass and the SFT step of a small Qwen2 shape on a {fsdp: 2, context: 4}
mesh, XLA's per-device FLOPs (`cost_analysis`) and temporary memory (`memory_analysis`):
- flops: one layer, one log-prob chunk and one attention block per device, because XLA's cost
  analysis counts a while loop's body once, not once per trip (with loops, a per-rank chunk loop
  and a whole-sequence chunk loop would report the same body);
- memory: the same model with the shipped chunking (log-prob chunk 1024, attention block 512).
Run: PYTHONPATH=. python bench/bench_context_logprobs.py
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from jaxswe.model import get_preset  # noqa: E402
from jaxswe.train import make_compute_logprobs, make_sft_step  # noqa: E402
from jaxswe.train.state import TrainState, abstract_params  # noqa: E402
from sharding import make_mesh, make_rules  # noqa: E402

ROWS, T, AXES = 2, 4096, {"fsdp": 2, "context": 4}
SHAPE = dict(vocab_size=32768, hidden_size=256, intermediate_size=512, num_layers=1, num_heads=4,
             num_kv_heads=2, remat="full", attention="blockwise")  # fmt: skip


def compiled(config):
    mesh, rules = make_mesh(AXES), make_rules()
    params = abstract_params(config)
    ids = jax.ShapeDtypeStruct((ROWS, T), jnp.int32)
    batch = {k: ids for k in ("input_ids", "positions", "segment_ids")}
    recompute = make_compute_logprobs(config, mesh, rules).jitted.lower(params, batch).compile()
    opt = optax.sgd(1e-3)
    state = jax.eval_shape(lambda p: TrainState(p, opt.init(p), jnp.zeros((), jnp.int32)), params)
    batch = dict(batch, loss_mask=jax.ShapeDtypeStruct((ROWS, T), jnp.float32))
    step = make_sft_step(config, opt, mesh, rules).jitted.lower(state, batch).compile()
    return {"recompute": recompute, "sft step": step}


if __name__ == "__main__":
    print(f"rows {ROWS} x T {T}, mesh {AXES}, {SHAPE}")
    one_trip = get_preset("tiny", **SHAPE, logprob_chunk=T, attention_block=T // 4)
    for name, c in compiled(one_trip).items():
        print(f"{name}: {c.cost_analysis()['flops'] / 1e9:.2f} GFLOP per device (one-trip loops)", flush=True)
    shipped = get_preset("tiny", **SHAPE, logprob_chunk=1024, attention_block=512)
    for name, c in compiled(shipped).items():
        print(f"{name}: {c.memory_analysis().temp_size_in_bytes / 2**20:.1f} MiB temp per device", flush=True)
