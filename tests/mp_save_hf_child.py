"""One of 2 processes (4 CPU devices each) calling save_hf on fsdp-sharded params; writes the names
of the safetensors files this process wrote to OUT/written_<id>.json. Loads the files back into
the same placement and writes the checkpoint bytes it read and whether its shards equal the
params (bf16-rounded) to OUT/read_<id>.json. Then checks two helpers of
jaxswe.distributed across the processes and writes what each process saw to OUT/helpers_<id>.json:
an exception in `on_main` reaches every process, and host data that differ between processes
are caught.

usage: python mp_save_hf_child.py OUT PROCESS_ID PORT
"""

import json
import os
import sys
from pathlib import Path

out, process_id, port = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

from jaxswe import distributed  # noqa: E402

distributed.initialize(f"localhost:{port}", 2, process_id)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxswe.config import MeshSection  # noqa: E402
from jaxswe.model import hf_io  # noqa: E402
from jaxswe.model.config import get_preset  # noqa: E402
from jaxswe.model.params import init_params  # noqa: E402
from jaxswe.model.safetensors_ranges import bytes_read  # noqa: E402
from jaxswe.train.trainer import params_placement  # noqa: E402

CONFIG = get_preset("tiny", vocab_size=96, tie_word_embeddings=False, attention="dense")
# the trainer's layout on the global 8-device mesh (fsdp over both processes)
params = jax.jit(lambda k: init_params(CONFIG, k), out_shardings=params_placement(CONFIG, MeshSection()))(
    jax.random.key(0)
)
assert not any(x.is_fully_addressable for x in jax.tree.leaves(params) if x.ndim > 1)

written = []
real_save = hf_io.save_file
hf_io.save_file = lambda tensors, file, **kw: (
    written.append(Path(file).name),
    real_save(tensors, file, **kw),
)
hf_io.save_hf(out / "hf", CONFIG, params, dtype="bfloat16", max_shard_bytes=60_000)
(out / f"written_{process_id}.json").write_text(json.dumps(written))

placement = params_placement(CONFIG, MeshSection())
before = bytes_read()
_, loaded = hf_io.load_hf(out / "hf", dtype="float32", shardings=placement)
read = bytes_read() - before
rounded = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), p))(params)
same = all(
    a.index == b.index and np.array_equal(a.data, b.data)
    for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(rounded), strict=True)
    for a, b in zip(x.addressable_shards, y.addressable_shards, strict=True)
)
(out / f"read_{process_id}.json").write_text(json.dumps({"bytes_read": read, "same": same}))


def outcome(fn) -> str:
    try:
        fn()
        return "ok"
    except Exception as err:
        return f"{type(err).__name__}: {err}"


def fail_on_main():
    raise ValueError("process 0 failed")


seen = {
    "on_main": outcome(lambda: distributed.on_main(fail_on_main)),
    "on_main_after": distributed.on_main(lambda: "still in step"),
    "same": outcome(lambda: distributed.check_same_on_every_process([np.arange(3), None], "x")),
    "differ": outcome(lambda: distributed.check_same_on_every_process([np.arange(3) + process_id], "x")),
}
(out / f"helpers_{process_id}.json").write_text(json.dumps(seen))
