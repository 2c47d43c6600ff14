"""Weight export (`save_hf`) cost: the time to export Qwen2.5-1.5B shapes (random bf16 params
sharded over the fake CPU devices) to bf16 safetensors, against a plain `safetensors.numpy.save_file`
of the same bytes from host arrays (the disk floor) in the same run; and the bytes each host
writes per weight sync for Qwen2.5-72B on 16 hosts, from the file assignment `save_hf` uses (no
arrays allocated).

`save_hf` holds the params, this process's host blocks and one file's Hugging Face layout copies
at once: ~3x the bf16 bytes (9 GB for 1.5B). `--layers N` keeps the real widths and vocabulary
with N of the 28 layers, for machines without that much free memory.

Run once:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python bench/bench_export.py [--layers 28]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from jaxswe.model import count_params, get_preset, init_params, save_hf  # noqa: E402
from jaxswe.model.hf_io import export_bytes_per_process  # noqa: E402
from jaxswe.model.params import param_logical_axes  # noqa: E402
from sharding.mesh import make_mesh  # noqa: E402
from sharding.rules import make_rules, param_shardings  # noqa: E402


def sync_bytes(preset: str, hosts: int) -> list[int]:
    return export_bytes_per_process(get_preset(preset), hosts, "bfloat16")


def _random_leaf(key: jax.Array, like: jax.ShapeDtypeStruct, sharding) -> jax.Array:
    """N(0, 0.02) in like's shape and dtype, created in its shards (one leaf's temporaries at a time)."""
    return jax.jit(lambda k: 0.02 * jax.random.normal(k, like.shape, like.dtype), out_shardings=sharding)(key)


def export_time(out: Path, layers: int) -> dict[str, float]:
    config = get_preset("qwen2.5-1.5b", num_layers=layers, param_dtype="bfloat16")
    mesh = make_mesh({"fsdp": len(jax.devices())})
    abstract = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    shardings = param_shardings(mesh, make_rules(), param_logical_axes(config), abstract)
    keys = iter(jax.random.split(jax.random.key(0), len(jax.tree.leaves(abstract))))
    params = jax.tree.map(lambda a, s: _random_leaf(next(keys), a, s), abstract, shardings)
    jax.block_until_ready(params)
    start = time.perf_counter()
    save_hf(out / "hf", config, params)  # bf16 by default
    export_s = time.perf_counter() - start
    written = sum(f.stat().st_size for f in (out / "hf").glob("*.safetensors"))
    del params
    gc.collect()
    shutil.rmtree(out / "hf")

    # the peer: the same bytes as host bf16 arrays, written by safetensors alone
    rng = np.random.default_rng(0)
    chunk = rng.standard_normal(64 * 1024**2 // 2, dtype=np.float32).astype(jax.numpy.bfloat16)
    tensors = {f"t{i}": chunk for i in range(written // chunk.nbytes)}
    start = time.perf_counter()
    save_file(tensors, str(out / "raw.safetensors"))
    raw_s = (time.perf_counter() - start) * written / (len(tensors) * chunk.nbytes)
    os.remove(out / "raw.safetensors")
    return {"params": count_params(config), "bytes": written, "export_s": export_s, "raw_write_s": raw_s}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None, help="scratch dir on the disk to measure")
    parser.add_argument("--layers", type=int, default=28, help="layers of the 1.5B shape (28: all)")
    args = parser.parse_args()
    per_host = sync_bytes("qwen2.5-72b", 16)
    print(f"qwen2.5-72b, 16 hosts, bf16: {sum(per_host) / 1e9:.1f} GB per sync; per host GB:",
          " ".join(f"{b / 1e9:.2f}" for b in per_host))  # fmt: skip
    out = Path(tempfile.mkdtemp(dir=args.out))
    try:
        r = export_time(out, args.layers)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    gbs = r["bytes"] / r["export_s"] / 1e9
    shape = f"qwen2.5-1.5b shapes, {args.layers} layers ({r['params'] / 1e9:.2f}B params)"
    print(f"{shape}, bf16 on {len(jax.devices())} devices")
    print(f"  save_hf -> bf16: {r['bytes'] / 1e9:.2f} GB in {r['export_s']:.1f} s ({gbs * 1e3:.0f} MB/s)")
    print(f"  peer, safetensors save_file of the same bytes from host: {r['raw_write_s']:.1f} s")
    print(f"  ratio save_hf / peer: {r['export_s'] / r['raw_write_s']:.2f}")


if __name__ == "__main__":
    main()
