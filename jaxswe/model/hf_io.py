"""Hugging Face safetensors <-> the stacked parameter pytree.

`load_hf` reads config.json and one or many *.safetensors (model.safetensors.index.json when
sharded). With a mesh, every array is built by `jax.make_array_from_callback` from exactly the
slice each device needs, read as byte ranges (`safetensors_ranges`): a host reads its share of
the checkpoint, never the whole model.
`save_hf` writes sharded safetensors + index + config.json that transformers and SGLang load;
with several processes each writes the files of the layers it owns, and no host gathers the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from safetensors.numpy import save_file

from jaxswe.errors import UserError
from jaxswe.model.config import ModelConfigError, Qwen2Config
from jaxswe.model.params import Params, param_logical_axes, param_shapes
from jaxswe.model.safetensors_ranges import SafetensorsFile
from sharding.logical import Rules
from sharding.rules import param_shardings

INDEX_FILE = "model.safetensors.index.json"
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


class WeightsError(UserError):
    """A checkpoint directory whose weights do not match the model (missing tensor, bad shape)."""


@dataclasses.dataclass(frozen=True)
class _Mapping:
    """How one of our leaves relates to Hugging Face tensors.

    kind: copy (same layout), t (2-D transpose), out_heads (HF [H*D, E] -> [E, H, D]),
    in_heads (HF [E, H*D] -> [H, D, E]), bias_heads (HF [H*D] -> [H, D]).
    """

    hf_name: str  # with "{i}" for the layer index when stacked
    kind: str
    stacked: bool


_LAYER = "model.layers.{i}."
_LAYER_MAPPINGS = {
    "attn_norm": _Mapping(_LAYER + "input_layernorm.weight", "copy", True),
    "wq": _Mapping(_LAYER + "self_attn.q_proj.weight", "out_heads", True),
    "bq": _Mapping(_LAYER + "self_attn.q_proj.bias", "bias_heads", True),
    "wk": _Mapping(_LAYER + "self_attn.k_proj.weight", "out_heads", True),
    "bk": _Mapping(_LAYER + "self_attn.k_proj.bias", "bias_heads", True),
    "wv": _Mapping(_LAYER + "self_attn.v_proj.weight", "out_heads", True),
    "bv": _Mapping(_LAYER + "self_attn.v_proj.bias", "bias_heads", True),
    "wo": _Mapping(_LAYER + "self_attn.o_proj.weight", "in_heads", True),
    "mlp_norm": _Mapping(_LAYER + "post_attention_layernorm.weight", "copy", True),
    "w_gate": _Mapping(_LAYER + "mlp.gate_proj.weight", "t", True),
    "w_up": _Mapping(_LAYER + "mlp.up_proj.weight", "t", True),
    "w_down": _Mapping(_LAYER + "mlp.down_proj.weight", "t", True),
}


def _mappings(config: Qwen2Config) -> dict[str, Any]:
    out: dict[str, Any] = {
        "embed": _Mapping("model.embed_tokens.weight", "copy", False),
        "layers": dict(_LAYER_MAPPINGS),
        "final_norm": _Mapping("model.norm.weight", "copy", False),
    }
    if not config.tie_word_embeddings:
        out["lm_head"] = _Mapping("lm_head.weight", "t", False)
    return out


def _hf_shape(kind: str, ours: tuple[int, ...]) -> tuple[int, ...]:
    """Hugging Face shape of one (per-layer) tensor given our per-layer shape."""
    if kind == "copy":
        return ours
    if kind == "t":
        return ours[::-1]
    if kind == "out_heads":
        return (ours[1] * ours[2], ours[0])
    if kind == "in_heads":
        return (ours[2], ours[0] * ours[1])
    return (ours[0] * ours[1],)  # bias_heads


def to_hf_layout(kind: str, ours: np.ndarray) -> np.ndarray:
    """One per-layer array in our layout -> Hugging Face layout."""
    if kind == "copy":
        return ours
    if kind == "t":
        return ours.T
    if kind == "out_heads":
        return ours.reshape(ours.shape[0], -1).T
    if kind == "in_heads":
        return ours.reshape(-1, ours.shape[-1]).T
    return ours.reshape(-1)


def _read_slice(read: Callable, kind: str, head_dim: int, index: tuple[slice, ...]) -> np.ndarray:
    """Read the part of one HF tensor that our per-layer `index` (normalized slices) covers;
    `read(hf_index)` reads a region of the HF tensor."""
    if kind == "copy":
        return read(index)
    if kind == "t":
        return read((index[1], index[0])).T
    if kind == "out_heads":  # ours [E, H, D]
        se, sh, sd = index
        rows = slice(sh.start * head_dim, sh.stop * head_dim)
        block = read((rows, se)).T
        return block.reshape(block.shape[0], -1, head_dim)[:, :, sd]
    if kind == "in_heads":  # ours [H, D, E]
        sh, sd, se = index
        block = read((se, slice(sh.start * head_dim, sh.stop * head_dim))).T
        return block.reshape(-1, head_dim, block.shape[-1])[:, sd, :]
    sh, sd = index  # bias_heads
    return read((slice(sh.start * head_dim, sh.stop * head_dim),)).reshape(-1, head_dim)[:, sd]


class _TensorFiles:
    """Name -> safetensors file lookup over one or many files, with lazily opened files."""

    def __init__(self, path: Path):
        index = path / INDEX_FILE
        self._files: dict[Path, SafetensorsFile] = {}
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as err:
                raise WeightsError(f"{index}: not a safetensors index ({err})") from None
            self.file_of = {name: path / file for name, file in weight_map.items()}
        else:
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise WeightsError(f"{path}: no *.safetensors files")
            self.file_of = {name: file for file in files for name in self._open(file).keys()}  # noqa: SIM118

    def _open(self, file: Path) -> SafetensorsFile:
        if file not in self._files:
            if not file.is_file():
                raise WeightsError(f"{file}: listed in {INDEX_FILE} but missing")
            self._files[file] = SafetensorsFile(file)
        return self._files[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._open(self.file_of[name]).shape(name)

    def reader(self, name: str) -> Callable[[tuple[slice, ...]], np.ndarray]:
        """read(index) -> tensor `name`'s region `index`, reading only its bytes."""
        file = self._open(self.file_of[name])
        return lambda index: file.read(name, _normalize(index, file.shape(name)))

    def close(self) -> None:
        for file in self._files.values():
            file.close()


def read_hf_config(path: str | Path, **runtime: Any) -> Qwen2Config:
    """The Qwen2Config of a Hugging Face directory's config.json; `runtime` sets the runtime knobs
    (dtype = compute dtype, param_dtype, remat, ...), which config.json never holds. The file's
    `torch_dtype` is only how the weights are stored: it sets neither dtype."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise WeightsError(f"{path}: no config.json (not a Hugging Face model directory)")
    try:
        hf = json.loads(file.read_text())
    except ValueError as err:
        raise ModelConfigError(f"{file}: invalid JSON ({err})") from None
    return Qwen2Config.from_hf_dict(hf, **runtime)


def _normalize(index: tuple, shape: tuple[int, ...]) -> tuple[slice, ...]:
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))


def _check_tensor(files: _TensorFiles, name: str, expected: tuple[int, ...], path: Path) -> None:
    if name not in files.file_of:
        raise WeightsError(f"{path}: missing tensor {name}")
    got = files.shape(name)
    if got != expected:
        raise WeightsError(f"{path}: tensor {name} has shape {list(got)}, expected {list(expected)}")


def _leaf_reader(files: _TensorFiles, m: _Mapping, shape: tuple[int, ...], head_dim: int, dtype):
    """callback(index) -> np.ndarray of our leaf's `index` region, read slice by slice."""

    def read(index: tuple) -> np.ndarray:
        index = _normalize(index, shape)
        if not m.stacked:
            return np.asarray(_read_slice(files.reader(m.hf_name), m.kind, head_dim, index), dtype)
        layers = range(index[0].start, index[0].stop)
        parts = [
            _read_slice(files.reader(m.hf_name.format(i=i)), m.kind, head_dim, index[1:]) for i in layers
        ]
        return np.stack(parts).astype(dtype)

    return read


def _resolve_shardings(config, mesh, shardings, rules):
    if callable(shardings):
        return shardings(config)
    if shardings is not None:
        return shardings
    if mesh is None:
        return None
    if rules is not None:  # as the trainer lays params out: a mesh axis that does not divide is dropped
        shapes = jax.tree.map(
            lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32),
            param_shapes(config),
            is_leaf=lambda x: isinstance(x, tuple),
        )
        return param_shardings(mesh, rules, param_logical_axes(config), shapes)
    return jax.tree.map(
        lambda _: NamedSharding(mesh, PartitionSpec()),
        param_logical_axes(config),
        is_leaf=lambda x: isinstance(x, tuple),
    )


def load_hf(
    path: str | Path,
    *,
    dtype: Any = jnp.float32,
    param_dtype: Any = None,
    mesh: Mesh | None = None,
    shardings: Any | Callable[[Qwen2Config], Any] | None = None,
    rules: Rules | None = None,
    **runtime: Any,
) -> tuple[Qwen2Config, Params]:
    """(config, params) from a Hugging Face Qwen2 directory.

    `dtype` is the compute dtype (`config.dtype`); `param_dtype` is the dtype of the returned
    arrays (`config.param_dtype`), `dtype` when not given. Neither depends on the checkpoint's
    stored dtype: a bf16 checkpoint loaded with `dtype=jnp.float32` is float32 arrays computing in
    float32; training loads `dtype=bfloat16, param_dtype=float32` (bf16 compute, fp32 masters).
    Each array is created with its sharding: `shardings` (a pytree of Shardings like the params,
    or a function of the config returning one), else, with a mesh, `rules` (logical axis -> mesh
    axes, applied to param_logical_axes as the trainer applies them: a mesh axis that does not
    divide a dimension is dropped there, `sharding.rules.param_shardings`), else replicated on
    the mesh; with neither the arrays go to the default device. `runtime` sets the other
    Qwen2Config runtime knobs.
    """
    path = Path(path)
    dtype = jnp.dtype(dtype).name
    param_dtype = jnp.dtype(param_dtype if param_dtype is not None else dtype).name
    config = read_hf_config(path, dtype=dtype, param_dtype=param_dtype, **runtime)
    files = _TensorFiles(path)
    np_dtype = np.dtype(jnp.dtype(param_dtype))
    mappings, shapes = _mappings(config), param_shapes(config)
    placement = _resolve_shardings(config, mesh, shardings, rules)
    is_map = lambda x: isinstance(x, _Mapping)
    flat_maps, treedef = jax.tree.flatten(mappings, is_leaf=is_map)
    flat_shapes = treedef.flatten_up_to(shapes)
    flat_place = [None] * len(flat_maps) if placement is None else treedef.flatten_up_to(placement)

    for m, shape in zip(flat_maps, flat_shapes, strict=True):
        per_layer = shape[1:] if m.stacked else shape
        for i in range(config.num_layers if m.stacked else 1):
            _check_tensor(files, m.hf_name.format(i=i), _hf_shape(m.kind, per_layer), path)

    leaves = []
    try:
        for m, shape, sharding in zip(flat_maps, flat_shapes, flat_place, strict=True):
            read = _leaf_reader(files, m, shape, config.head_dim, np_dtype)
            if sharding is None:
                leaves.append(jnp.asarray(read(())))
            else:
                leaves.append(jax.make_array_from_callback(shape, sharding, read))
    finally:
        files.close()
    return config, jax.tree.unflatten(treedef, leaves)


def _hf_tensors(config: Qwen2Config, params: Params):
    """(name, per-layer mapping, leaf, layer index or None) for every Hugging Face tensor, in file order."""
    mappings = _mappings(config)
    flat_maps, treedef = jax.tree.flatten(mappings, is_leaf=lambda x: isinstance(x, _Mapping))
    try:
        flat_leaves = treedef.flatten_up_to(params)
    except (ValueError, TypeError) as err:
        raise WeightsError(f"params do not match the config's layout: {err}") from None
    expected = param_shapes(config)
    for m, leaf, shape in zip(flat_maps, flat_leaves, treedef.flatten_up_to(expected), strict=True):
        if tuple(leaf.shape) != tuple(shape):
            raise WeightsError(f"param for {m.hf_name} has shape {list(leaf.shape)}, expected {list(shape)}")
    items = [
        (m.hf_name, m, leaf, None) for m, leaf in zip(flat_maps, flat_leaves, strict=True) if not m.stacked
    ]
    for i in range(config.num_layers):
        items += [(m.hf_name.format(i=i), m, leaf, i) for m, leaf in zip(flat_maps, flat_leaves, strict=True)
                  if m.stacked]  # fmt: skip
    return items


def _process_grid(leaf: jax.Array) -> np.ndarray:
    """The leaf's devices as [process, local device]."""
    devices = sorted(leaf.sharding.device_set, key=lambda d: (d.process_index, d.id))
    procs = sorted({d.process_index for d in devices})
    return np.array(devices, dtype=object).reshape(len(procs), -1)


def _layer_groups(num_layers: int, num_processes: int) -> int:
    """How many groups of processes the layers are split over (each group holds whole layers)."""
    return math.gcd(num_layers, num_processes)


def _owner(layer: int | None, num_layers: int, num_processes: int, name: str = "") -> int:
    """The process that writes a tensor: per-layer tensors by layer group, the LM head the last
    process (it is as large as the embedding), the others process 0."""
    if layer is None:
        return num_processes - 1 if name == "lm_head.weight" else 0
    groups = _layer_groups(num_layers, num_processes)
    return (layer // (num_layers // groups)) * (num_processes // groups)


def _own_block(leaf: jax.Array, m: _Mapping, dtype) -> tuple[np.ndarray | None, int]:
    """This process's part of one leaf on the host, in `dtype`, as (block, first layer): whole
    layers of its layer group (stacked leaves) or the whole leaf (others, on its owner); None
    when it writes nothing of the leaf. Multi-process leaves are resharded on device (one leaf at a
    time) so that each layer group's devices hold its layers whole; no host gathers the model."""
    stacked = m.stacked
    if leaf.is_fully_addressable:
        return np.asarray(leaf.astype(dtype)), 0
    grid = _process_grid(leaf)
    num_procs = grid.shape[0]
    groups = _layer_groups(leaf.shape[0], num_procs) if stacked else 1
    mesh = Mesh(grid.reshape(groups, -1), ("group", "rest"))
    spec = PartitionSpec("group") if stacked else PartitionSpec()
    moved = jax.jit(lambda x: x.astype(dtype), out_shardings=NamedSharding(mesh, spec))(leaf)
    shard = moved.addressable_shards[0]
    first = shard.index[0].start or 0 if stacked else 0
    me = jax.process_index()
    mine = _owner(first if stacked else None, leaf.shape[0] if stacked else 1, num_procs, m.hf_name) == me
    return (np.asarray(shard.data) if mine else None), first


def _file_plan(items: list[tuple], num_layers: int, num_procs: int, itemsize: int, max_shard_bytes: int):
    """The files of an export, the same on every process: ([(owner, items)], file names), each
    file holding consecutive tensors of one owner, under max_shard_bytes."""
    shards: list[tuple[int, list[tuple]]] = []
    size = 0
    for item in items:
        owner = _owner(item[3], num_layers, num_procs, item[0])
        per_layer = item[2].shape[1:] if item[1].stacked else item[2].shape
        nbytes = int(np.prod(per_layer)) * itemsize
        if not shards or shards[-1][0] != owner or (shards[-1][1] and size + nbytes > max_shard_bytes):
            shards.append((owner, []))
            size = 0
        shards[-1][1].append(item)
        size += nbytes
    names = [
        "model.safetensors" if len(shards) == 1 else f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        for n in range(1, len(shards) + 1)
    ]
    return shards, names


def export_bytes_per_process(config: Qwen2Config, num_processes: int, dtype: str = "bfloat16") -> list[int]:
    """Bytes of safetensors each of `num_processes` processes writes in one `save_hf` (no arrays
    needed: the plan only reads shapes)."""
    shapes = param_shapes(config)
    abstract = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s, np.float32), shapes, is_leaf=lambda x: isinstance(x, tuple)
    )
    items = _hf_tensors(config, abstract)
    itemsize = np.dtype(_NP_DTYPES[dtype]).itemsize
    shards, _ = _file_plan(items, config.num_layers, num_processes, itemsize, 5 * 1024**3)
    out = [0] * num_processes
    for owner, shard in shards:
        for _, m, leaf, _ in shard:
            out[owner] += int(np.prod(leaf.shape[1:] if m.stacked else leaf.shape)) * itemsize
    return out


def save_hf(
    path: str | Path,
    config: Qwen2Config,
    params: Params,
    *,
    dtype: str = "bfloat16",
    max_shard_bytes: int = 5 * 1024**3,
) -> Path:
    """Write safetensors shards (+ index when more than one) and config.json to directory `path`.

    `dtype` ("bfloat16" | "float32" | "float16") is what the files hold, whatever the params' dtype:
    bfloat16 unless asked (what SGLang serves; half the bytes of float32 masters). With several
    processes every process must call it: each writes the files of the tensors it owns (whole
    layers of its layer group, see `_owner`), process 0 also the index and config.json. Files are
    written to a temporary directory next to `path` and moved into place at the end, so an error
    leaves nothing half-written. Returns the path.
    """
    from jaxswe.distributed import barrier, broadcast, is_main

    path = Path(path)
    items = _hf_tensors(config, params)
    if dtype not in _NP_DTYPES:
        raise WeightsError(f"save_hf: dtype {dtype!r} not in {sorted(_NP_DTYPES)}")
    np_dtype = np.dtype(_NP_DTYPES[dtype])
    num_procs, me = jax.process_count(), jax.process_index()

    shards, names = _file_plan(items, config.num_layers, num_procs, np_dtype.itemsize, max_shard_bytes)

    # This process's blocks of every leaf (a collective per multi-process leaf, in the same order
    # everywhere).
    blocks: dict[int, tuple[np.ndarray | None, int]] = {}
    for _, m, leaf, _ in items:
        if id(leaf) not in blocks:
            blocks[id(leaf)] = _own_block(leaf, m, np_dtype)

    if is_main():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(broadcast(_new_tmp_dir(path) if is_main() else None))
    file_mode = 0o666 & ~_umask()  # safetensors writes 0600; a server of another user must read them
    try:
        weight_map, total = {}, 0
        for file, (owner, shard) in zip(names, shards, strict=True):
            tensors = {}
            for name, m, leaf, layer in shard:
                weight_map[name] = file
                total += int(np.prod(_hf_shape(m.kind, leaf.shape[1:] if m.stacked else leaf.shape)))
                if owner != me:
                    continue
                block, first = blocks[id(leaf)]
                ours = block if layer is None else block[layer - first]
                tensors[name] = np.ascontiguousarray(to_hf_layout(m.kind, ours))
            if owner == me:
                save_file(tensors, str(tmp / file), metadata={"format": "pt"})
                os.chmod(tmp / file, file_mode)
        barrier(f"save_hf files {path}")
        if is_main():
            if len(shards) > 1:
                index = {"metadata": {"total_size": total * np_dtype.itemsize}, "weight_map": weight_map}
                (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
            hf_config = config.to_hf_dict(torch_dtype=dtype)
            (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
            _move_into(tmp, path)
    finally:
        if is_main():
            shutil.rmtree(tmp, ignore_errors=True)
    barrier(f"save_hf done {path}")
    return path


def _umask() -> int:
    """The process's umask, read from /proc where it can be (os.umask can only read it by setting it
    process-wide for a moment, which another thread's new file could catch)."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _new_tmp_dir(path: Path) -> str:
    """A temporary dir beside `path` with a plain mkdir's modes: mkdtemp's 0700 would leave the
    published model unreadable to a server that runs as another user."""
    tmp = tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent)
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


def _move_into(src: Path, dst: Path) -> None:
    """Replace dst's weights and config with src's files (dst's other files, e.g. a tokenizer, stay)."""
    if not dst.exists():
        os.replace(src, dst)
        return
    if not dst.is_dir():
        raise WeightsError(f"{dst}: exists and is not a directory")
    for old in [*dst.glob("*.safetensors"), dst / INDEX_FILE]:
        old.unlink(missing_ok=True)
    for new in src.iterdir():
        os.replace(new, dst / new.name)
