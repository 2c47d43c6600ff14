"""Weights I/O: Hugging Face safetensors (single and sharded) and Orbax, round trips and errors."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from jaxswe.cli import main
from jaxswe.errors import UserError
from jaxswe.model import Qwen2Config, get_preset, init_params, load_hf, save_hf, token_logprobs
from jaxswe.model.config import ModelConfigError
from jaxswe.model.hf_io import WeightsError
from jaxswe.model.orbax_io import CheckpointError, load_params_orbax, save_params_orbax
from jaxswe.model.safetensors_ranges import SafetensorsFile, bytes_read

CONFIG = get_preset("tiny", vocab_size=97, tie_word_embeddings=False, attention="dense")


def random_params(config, seed=0):
    """init_params with every leaf perturbed (biases and norms included)."""
    params = init_params(config, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 1), len(jax.tree.leaves(params))))
    return jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), params)


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_save_hf_loads_in_transformers_with_same_logprobs(tmp_path, tied):
    config = CONFIG.replace(tie_word_embeddings=tied)
    params = random_params(config)
    save_hf(tmp_path / "m", config, params, dtype="float32")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["architectures"] == ["Qwen2ForCausalLM"] and saved["torch_dtype"] == "float32"
    model = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "m").eval()
    ids = np.random.default_rng(0).integers(0, 97, size=(2, 16))
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor(ids)).logits.double(), -1).numpy()
    ref = np.zeros(ids.shape)
    ref[:, 1:] = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]
    ours = np.asarray(token_logprobs(params, config, jnp.asarray(ids)))
    np.testing.assert_allclose(ours, ref, atol=1e-4)


def test_yarn_config_round_trips_through_transformers(tmp_path):
    config = CONFIG.replace(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    )
    save_hf(tmp_path / "m", config, random_params(config))
    hf = transformers.AutoConfig.from_pretrained(tmp_path / "m")
    assert hf.rope_parameters["rope_type"] == "yarn" and hf.rope_parameters["factor"] == 4.0
    assert Qwen2Config.from_hf_dict(hf.to_dict()).rope_scaling == config.rope_scaling
    loaded, _ = load_hf(tmp_path / "m")
    assert loaded.rope_scaling == config.rope_scaling and loaded.rope_theta == config.rope_theta


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_load_save_load_is_bit_exact(tmp_path, dtype):
    save_hf(tmp_path / "a", CONFIG, random_params(CONFIG), dtype=dtype)
    config, first = load_hf(tmp_path / "a", dtype=jnp.dtype(dtype))
    save_hf(tmp_path / "b", config, first, dtype=dtype)
    _, second = load_hf(tmp_path / "b", dtype=jnp.dtype(dtype))
    assert_trees_equal(first, second)
    for name, tensor in load_file(tmp_path / "a" / "model.safetensors").items():
        np.testing.assert_array_equal(tensor, load_file(tmp_path / "b" / "model.safetensors")[name])


def test_multi_file_with_index_loads_here_and_in_transformers(tmp_path):
    params = random_params(CONFIG)
    save_hf(tmp_path / "m", CONFIG, params, dtype="float32", max_shard_bytes=40_000)
    files = sorted(p.name for p in (tmp_path / "m").glob("*.safetensors"))
    assert len(files) > 2 and (tmp_path / "m" / "model.safetensors.index.json").is_file()
    _, loaded = load_hf(tmp_path / "m")
    assert_trees_equal(params, loaded)
    transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "m")  # loads without missing keys
    model = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "m", output_loading_info=True)[1]
    assert not model["missing_keys"] and not model["unexpected_keys"]


def test_sharded_load_places_each_array_from_slices(tmp_path):
    config = CONFIG.replace(num_heads=8, num_kv_heads=4, head_dim=16, vocab_size=96)
    params = random_params(config)
    save_hf(tmp_path / "m", config, params, dtype="float32", max_shard_bytes=100_000)
    mesh = jax.make_mesh((2, 4), ("fsdp", "tensor"))
    rules = {"embed": "fsdp", "heads": "tensor", "kv_heads": "tensor", "mlp": "tensor", "vocab": "tensor",
             "head_dim": "fsdp"}  # fmt: skip
    _, sharded = load_hf(tmp_path / "m", mesh=mesh, rules=rules)
    assert sharded["layers"]["wq"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
    assert sharded["layers"]["wo"].sharding.spec == jax.sharding.PartitionSpec(None, "tensor", "fsdp", None)
    assert len(sharded["layers"]["wo"].addressable_shards) == 8
    assert_trees_equal(params, sharded)


def test_sharded_load_drops_an_axis_that_does_not_divide(tmp_path):
    """With the default rules on a (fsdp 2, tensor 4) mesh, vocab 97 and 2 kv heads do not divide by
    the tensor axis: load_hf leaves them replicated, as the trainer's own layout does."""
    from jaxswe.model.params import param_logical_axes
    from sharding import make_rules
    from sharding.rules import param_shardings

    config = CONFIG.replace(num_heads=8, num_kv_heads=2, head_dim=16)
    params = random_params(config)
    save_hf(tmp_path / "m", config, params, dtype="float32")
    mesh = jax.make_mesh((1, 2, 1, 4), ("data", "fsdp", "context", "tensor"))
    rules = make_rules()
    _, sharded = load_hf(tmp_path / "m", mesh=mesh, rules=rules)
    P = jax.sharding.PartitionSpec
    assert sharded["embed"].sharding.spec == P(None, "fsdp")  # vocab 97, tensor 4
    assert sharded["layers"]["wk"].sharding.spec == P(None, "fsdp", None, None)  # 2 kv heads, tensor 4
    assert sharded["layers"]["wq"].sharding.spec == P(None, "fsdp", "tensor", None)
    trainer_layout = param_shardings(mesh, rules, param_logical_axes(config), params)
    for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(trainer_layout), strict=True):
        assert got.sharding.is_equivalent_to(want, got.ndim)
    assert_trees_equal(params, sharded)


def test_range_reads_take_only_the_slice_bytes(tmp_path):
    """A region of a 3-D bf16 tensor (partial in every dim) read by byte ranges equals numpy's
    slice, and the reads total exactly the region's bytes."""
    x = np.arange(6 * 10 * 12, dtype=np.float32).reshape(6, 10, 12).astype(ml_dtypes.bfloat16)
    save_file({"x": x, "y": np.ones(3, np.float32)}, tmp_path / "t.safetensors")
    file = SafetensorsFile(tmp_path / "t.safetensors")
    for index in [(slice(1, 4), slice(2, 7), slice(3, 9)), (slice(2, 5), slice(0, 10), slice(0, 12)),
                  (slice(0, 6), slice(0, 10), slice(4, 5))]:  # fmt: skip
        before = bytes_read()
        got = file.read("x", index)
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, x[index])
        assert bytes_read() - before == x[index].nbytes
    file.close()


def _write_without(src, dst, drop=None, reshape=None):
    tensors = load_file(src / "model.safetensors")
    if drop:
        tensors.pop(drop)
    if reshape:
        tensors[reshape] = tensors[reshape][:-1]
    dst.mkdir()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text((src / "config.json").read_text())


def test_missing_tensor_wrong_shape_and_architecture_are_clear_errors(tmp_path):
    save_hf(tmp_path / "ok", CONFIG, random_params(CONFIG))
    _write_without(tmp_path / "ok", tmp_path / "missing", drop="model.layers.1.self_attn.k_proj.bias")
    with pytest.raises(WeightsError, match=r"missing tensor model\.layers\.1\.self_attn\.k_proj\.bias"):
        load_hf(tmp_path / "missing")
    _write_without(tmp_path / "ok", tmp_path / "shape", reshape="model.layers.0.mlp.up_proj.weight")
    with pytest.raises(WeightsError, match=r"model\.layers\.0\.mlp\.up_proj\.weight has shape \[127, 64\]"):
        load_hf(tmp_path / "shape")
    hf = json.loads((tmp_path / "ok" / "config.json").read_text())
    (tmp_path / "ok" / "config.json").write_text(json.dumps({**hf, "architectures": ["LlamaForCausalLM"],
                                                             "model_type": "llama"}))  # fmt: skip
    with pytest.raises(ModelConfigError, match="unsupported architecture"):
        load_hf(tmp_path / "ok")
    with pytest.raises(WeightsError, match="no config.json"):
        load_hf(tmp_path / "nowhere")
    assert issubclass(WeightsError, UserError) and issubclass(ModelConfigError, UserError)


def test_orbax_round_trip_and_mismatch(tmp_path):
    params = random_params(CONFIG)
    save_params_orbax(tmp_path / "ckpt", params, CONFIG)
    assert_trees_equal(params, load_params_orbax(tmp_path / "ckpt", CONFIG))
    with pytest.raises(CheckpointError, match="shape"):
        load_params_orbax(tmp_path / "ckpt", CONFIG.replace(intermediate_size=64))
    with pytest.raises(CheckpointError, match="no Orbax params"):
        load_params_orbax(tmp_path / "none", CONFIG)


def test_save_hf_writes_bfloat16_unless_asked(tmp_path):
    """float32 masters are exported as bf16 by default (the weight-sync size), float32 on request."""
    params = random_params(CONFIG)
    save_hf(tmp_path / "m", CONFIG, params)
    assert json.loads((tmp_path / "m" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "m" / "model.safetensors"), framework="numpy") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118
    _, loaded = load_hf(tmp_path / "m")
    assert_trees_equal(jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params), loaded)
    save_hf(tmp_path / "f", CONFIG, params, dtype="float32")
    assert_trees_equal(params, load_hf(tmp_path / "f")[1])


def test_convert_cli_hf_to_orbax_and_back(tmp_path, capsys):
    """Defaults: float32 Orbax masters from hf, bf16 safetensors back; --dtype float32 is exact."""
    params = random_params(CONFIG)
    save_hf(tmp_path / "hf", CONFIG, params, dtype="float32")
    main(["convert", str(tmp_path / "hf"), str(tmp_path / "orbax"), "--to", "orbax"])
    main(["convert", str(tmp_path / "orbax"), str(tmp_path / "hf2"), "--to", "hf", "--dtype", "float32"])
    assert_trees_equal(params, load_hf(tmp_path / "hf2")[1])
    main(["convert", str(tmp_path / "orbax"), str(tmp_path / "hf3"), "--to", "hf"])
    rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)
    assert_trees_equal(rounded, load_hf(tmp_path / "hf3")[1])
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(tmp_path / "hf"), str(tmp_path / "orbax"), "--to", "orbax"])
    assert exit_info.value.code == 2 and "already exists" in capsys.readouterr().err


def test_config_presets_and_bad_values():
    assert get_preset("qwen2.5-72b").rope_scaling.factor == 4.0
    assert get_preset("qwen2.5-72b").max_position_embeddings == 131072
    with pytest.raises(ModelConfigError, match="unknown model preset"):
        get_preset("qwen9")
    with pytest.raises(ModelConfigError, match="num_kv_heads"):
        CONFIG.replace(num_kv_heads=3)
    with pytest.raises(ModelConfigError, match="remat"):
        CONFIG.replace(remat="sometimes")
    with pytest.raises(ModelConfigError, match="rope_type 'linear'"):
        CONFIG.replace(rope_scaling={"rope_type": "linear", "factor": 2.0})
    hf = get_preset("qwen2.5-72b").to_hf_dict()
    assert Qwen2Config.from_hf_dict(hf, dtype="bfloat16") == get_preset("qwen2.5-72b")
