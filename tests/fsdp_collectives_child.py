"""Child of test_dtypes: compile a bf16-compute / fp32-master SFT step on an 8-way FSDP mesh of
fake CPU devices with each `optimizer.grad_reduce_dtype`, dump the HLO right after SPMD
partitioning (the CPU backend later upcasts every bf16 op to f32), and print
`grad_reduce_dtype collective dtype[shape] count` for every all-gather, all-reduce and
reduce-scatter there that spans more than one device. argv[1]: dump directory."""

import os
import sys

os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=8 "
    f"--xla_dump_to={sys.argv[1]} --xla_dump_hlo_pass_re=spmd-partitioning"
)
os.environ["JAX_PLATFORMS"] = "cpu"

import re  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxswe.config import OptimizerSection  # noqa: E402
from jaxswe.model import get_preset  # noqa: E402
from jaxswe.optim import make_optimizer  # noqa: E402
from jaxswe.train import make_sft_step  # noqa: E402
from jaxswe.train.state import TrainState, abstract_params  # noqa: E402
from sharding import make_mesh, make_rules  # noqa: E402

COLLECTIVE = re.compile(
    r"= (\w+\[[\d,]*\])\{?[^=]*? (all-gather|all-reduce|reduce-scatter)\(.*?replica_groups=(\S+)"
)
SETTINGS = ("float32", "bfloat16")

opt = make_optimizer(OptimizerSection())
batch = {k: jax.ShapeDtypeStruct((8, 128), jnp.float32 if k == "loss_mask" else jnp.int32)
         for k in ("input_ids", "positions", "segment_ids", "loss_mask")}  # fmt: skip
for grad_dtype in SETTINGS:
    cfg = get_preset("tiny", dtype="bfloat16", param_dtype="float32", hidden_size=128, intermediate_size=256,
                     vocab_size=512, tie_word_embeddings=False, remat="full",
                     grad_reduce_dtype=grad_dtype)  # fmt: skip
    step = make_sft_step(cfg, opt, make_mesh({"fsdp": 8}), make_rules())
    shapes = abstract_params(cfg)
    state = TrainState(
        params=shapes, opt_state=jax.eval_shape(opt.init, shapes), step=jax.ShapeDtypeStruct((), jnp.int32)
    )
    step.jitted.lower(state, batch).compile()
dumps = sorted(Path(sys.argv[1]).glob("*jit_step*after_spmd-partitioning*"))
assert len(dumps) == len(SETTINGS), dumps
for grad_dtype, dump in zip(SETTINGS, dumps, strict=True):
    found = Counter(
        (op, array)
        for array, op, groups in COLLECTIVE.findall(dump.read_text())
        if not groups.startswith("{{0},")  # a psum over a size-1 mesh axis moves nothing
    )
    for (op, array), n in sorted(found.items()):
        print(grad_dtype, op, array, n)
