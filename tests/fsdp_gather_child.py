"""Child of test_dtypes: compile a bf16-compute / fp32-master SFT step on an 8-way FSDP mesh of
fake CPU devices, dump the HLO right after SPMD partitioning, print `dtype[shape] count` of every
all-gather there. argv[1]: dump directory."""

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

cfg = get_preset("tiny", dtype="bfloat16", param_dtype="float32", hidden_size=128, intermediate_size=256,
                 vocab_size=512, tie_word_embeddings=False, remat="full")  # fmt: skip
opt = make_optimizer(OptimizerSection())
step = make_sft_step(cfg, opt, make_mesh({"fsdp": 8}), make_rules())
shapes = abstract_params(cfg)
state = TrainState(
    params=shapes, opt_state=jax.eval_shape(opt.init, shapes), step=jax.ShapeDtypeStruct((), jnp.int32)
)
batch = {k: jax.ShapeDtypeStruct((8, 128), jnp.float32 if k == "loss_mask" else jnp.int32)
         for k in ("input_ids", "positions", "segment_ids", "loss_mask")}  # fmt: skip
step.jitted.lower(state, batch).compile()
(dump,) = Path(sys.argv[1]).glob("*jit_step*after_spmd-partitioning*")
found = re.findall(r"= (\w+\[[\d,]*\])\{?[^=]*? all-gather\(", dump.read_text())
for key, n in Counter(found).items():
    print(key, n)
