"""Qwen2 model numerics against transformers.Qwen2ForCausalLM (float32, CPU, tiny random configs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxswe.model import (
    count_params,
    decode_step,
    forward,
    get_preset,
    init_cache,
    init_params,
    load_hf,
    param_logical_axes,
    prefill,
    token_logprobs,
)
from jaxswe.model.rope import rope_frequencies

TOL = 1e-4


def make_hf_model(tmp_path, *, heads=4, kv_heads=2, hidden=32, tied=False, theta=1e6, rope=None, max_pos=256):
    """A random transformers Qwen2 (norms and biases perturbed too), saved to tmp_path."""
    torch.manual_seed(0)
    hf_config = transformers.Qwen2Config(
        vocab_size=97,
        hidden_size=hidden,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rope_theta=theta,
        rope_scaling=rope,
        tie_word_embeddings=tied,
        max_position_embeddings=max_pos,
    )
    model = transformers.Qwen2ForCausalLM(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    return model


def hf_logprobs(model, ids: np.ndarray, attention_mask: np.ndarray | None = None):
    """(log p(ids[t] | ids[:t]) with column 0 = 0, entropy, surprisal variance), float64 from
    transformers' logits."""
    with torch.no_grad():
        kwargs = {} if attention_mask is None else {"attention_mask": torch.tensor(attention_mask)}
        logits = model(torch.tensor(ids), **kwargs).logits.double()
    logp = torch.log_softmax(logits, -1).numpy()
    out = np.zeros(ids.shape)
    out[:, 1:] = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]
    entropy = np.zeros(ids.shape)
    entropy[:, 1:] = -(np.exp(logp) * logp).sum(-1)[:, :-1]
    var = np.zeros(ids.shape)
    var[:, 1:] = (np.exp(logp) * logp * logp).sum(-1)[:, :-1] - entropy[:, 1:] ** 2
    return out, entropy, var


def load_for_test(path, **changes):
    config, params = load_hf(path)
    return config.replace(
        dtype="float32", remat="none", attention_block=8, logprob_chunk=7, **changes
    ), params


jit_logprobs = jax.jit(token_logprobs, static_argnames=("config", "return_entropy", "return_variance"))


_HF_MODELS: dict = {}


def hf_dir(tmp_path_factory, **kwargs):
    """One saved transformers model per distinct config for the whole module."""
    key = tuple(sorted(kwargs.items()))
    if key not in _HF_MODELS:
        path = tmp_path_factory.mktemp("hf")
        _HF_MODELS[key] = (path, make_hf_model(path, **kwargs))
    return _HF_MODELS[key]


@pytest.mark.slow
@pytest.mark.parametrize(
    "heads,kv_heads,hidden,tied,theta",
    [(4, 4, 32, False, 1e6), (4, 2, 32, True, 1e6), (8, 2, 64, False, 1e4)],
    ids=["gqa1-untied", "gqa2-tied", "gqa4-theta1e4"],
)
def test_logprobs_match_transformers(tmp_path_factory, heads, kv_heads, hidden, tied, theta):
    path, model = hf_dir(
        tmp_path_factory, heads=heads, kv_heads=kv_heads, hidden=hidden, tied=tied, theta=theta
    )
    config, params = load_for_test(path)
    assert config.num_groups == heads // kv_heads and config.tie_word_embeddings == tied
    assert ("lm_head" in params) == (not tied)
    ids = np.random.default_rng(1).integers(0, 97, size=(2, 24))
    ref, ref_entropy, ref_var = hf_logprobs(model, ids)
    logp, entropy, var = jit_logprobs(
        params, config=config, input_ids=jnp.asarray(ids), return_entropy=True, return_variance=True
    )
    np.testing.assert_allclose(np.asarray(logp), ref, atol=TOL)
    np.testing.assert_allclose(np.asarray(entropy), ref_entropy, atol=TOL)
    np.testing.assert_allclose(np.asarray(var), ref_var, atol=10 * TOL)


@pytest.mark.slow
def test_unjitted_and_dense_paths_match_transformers(tmp_path_factory):
    path, model = hf_dir(tmp_path_factory, heads=4, kv_heads=2, hidden=32, tied=True, theta=1e6)
    config, params = load_for_test(path)
    ids = np.random.default_rng(1).integers(0, 97, size=(2, 24))
    ref, *_ = hf_logprobs(model, ids)
    np.testing.assert_allclose(np.asarray(token_logprobs(params, config, jnp.asarray(ids))), ref, atol=TOL)
    dense = jit_logprobs(params, config=config.replace(attention="dense"), input_ids=jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(dense), ref, atol=TOL)


def test_yarn_beyond_original_context_matches_transformers(tmp_path):
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    model = make_hf_model(tmp_path, rope=rope, max_pos=64)
    config, params = load_for_test(tmp_path)
    assert config.rope_scaling is not None and config.rope_scaling.factor == 4.0
    ids = np.random.default_rng(2).integers(0, 97, size=(2, 24))
    ids = np.concatenate([ids, ids], axis=1)  # positions up to 47 > 16
    ref, *_ = hf_logprobs(model, ids)
    np.testing.assert_allclose(
        np.asarray(jit_logprobs(params, config=config, input_ids=jnp.asarray(ids))), ref, atol=TOL
    )
    # the scaling matters at these positions: without it the log-probs differ
    plain = jit_logprobs(params, config=config.replace(rope_scaling=None), input_ids=jnp.asarray(ids))
    assert np.abs(np.asarray(plain) - ref).max() > 1e-3


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096, "truncate": False},
        {
            "rope_type": "yarn",
            "factor": 2.0,
            "original_max_position_embeddings": 1024,
            "attention_factor": 1.3,
        },
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 2048,
            "mscale": 0.7,
            "mscale_all_dim": 0.5,
            "beta_fast": 16,
            "beta_slow": 2,
        },  # fmt: skip
    ],
)
def test_yarn_frequencies_equal_transformers(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = transformers.Qwen2Config(
        hidden_size=1024,
        num_attention_heads=8,
        num_key_value_heads=8,
        rope_theta=1e6,
        rope_scaling=dict(rope),
        max_position_embeddings=131072,
    )
    ref_inv_freq, ref_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_config)
    from jaxswe.model import Qwen2Config

    config = Qwen2Config.from_hf_dict(hf_config.to_dict())
    inv_freq, factor = rope_frequencies(config)
    np.testing.assert_allclose(inv_freq, ref_inv_freq.numpy(), rtol=1e-6)  # float32 pow: 1 ulp
    assert factor == pytest.approx(ref_factor, rel=1e-12)


def test_right_padded_batch(tmp_path_factory):
    path, model = hf_dir(tmp_path_factory, heads=4, kv_heads=4, hidden=32, tied=False, theta=1e6)
    config, params = load_for_test(path)
    rng = np.random.default_rng(3)
    lengths = [24, 15]
    ids = rng.integers(0, 97, size=(2, 24))
    mask = (np.arange(24)[None] < np.array(lengths)[:, None]).astype(np.int64)
    ids = ids * mask  # pad id 0
    ref, *_ = hf_logprobs(model, ids, attention_mask=mask)
    out = np.asarray(
        jit_logprobs(params, config=config, input_ids=jnp.asarray(ids), segment_ids=jnp.asarray(mask))
    )
    np.testing.assert_allclose(out * mask, ref * mask, atol=TOL)
    assert (out[mask == 0] == 0).all()
    # without segment ids the real tokens are the same (padding only follows them)
    plain = np.asarray(jit_logprobs(params, config=config, input_ids=jnp.asarray(ids)))
    np.testing.assert_allclose(plain * mask, ref * mask, atol=TOL)


def test_packed_batch_equals_each_segment_alone(tmp_path_factory):
    path, model = hf_dir(tmp_path_factory, heads=4, kv_heads=4, hidden=32, tied=False, theta=1e6)
    config, params = load_for_test(path)
    rng = np.random.default_rng(4)
    rows = [[10, 8, 4], [3, 21]]  # segment lengths per row; 2 and 0 padding tokens at the end
    segments = [[rng.integers(1, 97, size=n) for n in lengths] for lengths in rows]
    ids = np.stack([np.concatenate(row + [np.zeros(24 - sum(map(len, row)), np.int64)]) for row in segments])
    seg_ids = np.stack(
        [
            np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)] + [np.zeros(24 - sum(lengths))])
            for lengths in rows
        ]  # fmt: skip
    ).astype(np.int32)
    out = np.asarray(
        jit_logprobs(params, config=config, input_ids=jnp.asarray(ids), segment_ids=jnp.asarray(seg_ids))
    )
    for b, row in enumerate(segments):
        start = 0
        for segment in row:
            ref, *_ = hf_logprobs(model, segment[None])
            np.testing.assert_allclose(out[b, start : start + len(segment)], ref[0], atol=TOL)
            start += len(segment)
        assert (out[b, start:] == 0).all()


@pytest.mark.slow
def test_prefill_then_decode_equals_full_forward():
    config = get_preset("tiny", vocab_size=61)
    params = init_params(config, jax.random.key(0))
    params = jax.tree.map(lambda x: x + 0.02 * jax.random.normal(jax.random.key(1), x.shape), params)
    rng = np.random.default_rng(5)
    lengths, prompt_len, steps = np.array([5, 9]), 9, 6
    prompts = rng.integers(0, 61, size=(2, prompt_len)) * (np.arange(prompt_len)[None] < lengths[:, None])
    continuation = rng.integers(0, 61, size=(2, steps))

    cache = init_cache(config, 2, 32, jnp.float32)
    logits, cache = jax.jit(prefill, static_argnums=1)(
        params, config, jnp.asarray(prompts), jnp.asarray(lengths), cache
    )
    step = jax.jit(decode_step, static_argnums=1)
    decoded = []
    for i in range(steps):
        decoded.append(
            np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), continuation[:, i : i + 1], 1)
        )
        logits, cache = step(params, config, jnp.asarray(continuation[:, i]), cache)
    decoded = np.concatenate(decoded, axis=1)
    assert list(np.asarray(cache["lengths"])) == list(lengths + steps)
    total = prompt_len + steps
    full = np.zeros((2, total), np.int64)
    for b in range(2):
        full[b, : lengths[b] + steps] = np.concatenate([prompts[b, : lengths[b]], continuation[b]])
    seg = (np.arange(total)[None] < (lengths + steps)[:, None]).astype(np.int32)
    ref = np.asarray(
        jit_logprobs(params, config=config, input_ids=jnp.asarray(full), segment_ids=jnp.asarray(seg))
    )
    for b in range(2):
        np.testing.assert_allclose(decoded[b], ref[b, lengths[b] : lengths[b] + steps], atol=TOL)


@pytest.mark.slow
def test_gradients_blockwise_and_remat_policies_equal_dense_reference():
    """Gradients through blockwise attention (custom VJP) under each remat policy == dense, no remat."""
    config = get_preset("tiny", attention_block=4)
    params = init_params(config, jax.random.key(2))
    ids = jnp.asarray(np.random.default_rng(6).integers(0, 256, size=(2, 13)))
    seg = jnp.asarray([[1] * 6 + [2] * 7, [1] * 10 + [0] * 3])
    grad = jax.jit(jax.grad(lambda p, c: token_logprobs(p, c, ids, segment_ids=seg).sum()), static_argnums=1)
    ref = grad(params, config.replace(attention="dense", remat="none"))
    for remat in ("full", "save_projections"):
        got = grad(params, config.replace(attention="blockwise", remat=remat))
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_compiled_program_does_not_grow_with_depth():
    sizes = []
    for layers in (2, 8):
        config = get_preset("tiny", num_layers=layers, remat="full")
        params = jax.eval_shape(lambda c=config: init_params(c, jax.random.key(0)))
        ids = jax.ShapeDtypeStruct((1, 16), jnp.int32)
        fn = jax.jit(jax.grad(lambda p, i, c=config: token_logprobs(p, c, i).sum()))
        sizes.append(len(fn.lower(params, ids).as_text()))
    assert abs(sizes[1] - sizes[0]) / sizes[0] < 0.01, sizes


def test_logprobs_never_materialize_full_vocab_logits():
    from jaxswe.model.logprobs import hidden_logprobs

    config = get_preset("tiny", vocab_size=8192, num_layers=1, logprob_chunk=128)
    params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    ids = jax.ShapeDtypeStruct((1, 2048), jnp.int32)
    hidden = jax.ShapeDtypeStruct((1, 2048, config.hidden_size), jnp.float32)
    full_logits_bytes = 2048 * 8192 * 4
    forward_temp = jax.jit(lambda p, i: token_logprobs(p, config, i)).lower(params, ids).compile()
    backward = jax.grad(lambda p, h, i: hidden_logprobs(p, h, i, 128)[0].sum(), argnums=(0, 1))
    backward_temp = jax.jit(backward).lower(params, hidden, ids).compile()
    for compiled in (forward_temp, backward_temp):
        assert compiled.memory_analysis().temp_size_in_bytes < full_logits_bytes / 2


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["full", "save_projections"])
def test_gradient_memory_grows_linearly_in_length(remat):
    """Compiled grad of token_logprobs keeps no per-(q block, kv block) masks or scores: 4x T -> < 6x temp.

    Quadratic growth would give ~16x (the layer scan used to hoist every block pair's mask out of the loop).
    Compile only, never executed.
    """
    config = get_preset("tiny", remat=remat, attention_block=256, logprob_chunk=256)
    params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    loss = jax.grad(lambda p, i, s: token_logprobs(p, config, i, segment_ids=s).sum())
    temp = {}
    for t in (1024, 4096):
        ids = jax.ShapeDtypeStruct((1, t), jnp.int32)
        temp[t] = jax.jit(loss).lower(params, ids, ids).compile().memory_analysis().temp_size_in_bytes
    assert temp[4096] < 6 * temp[1024], temp


def test_param_counts_match_released_models():
    assert count_params(get_preset("qwen2.5-0.5b")) == 494_032_768
    assert count_params(get_preset("qwen2.5-7b")) == 7_615_616_512
    assert count_params(get_preset("qwen2.5-72b")) == 72_706_203_648  # 72.7B


def test_logical_axes_mirror_params():
    for tied in (True, False):
        config = get_preset("tiny", tie_word_embeddings=tied)
        params = init_params(config, jax.random.key(0))
        axes = param_logical_axes(config)
        is_axes = lambda x: isinstance(x, tuple)
        assert jax.tree.structure(axes, is_leaf=is_axes) == jax.tree.structure(params)
        for names, leaf in zip(jax.tree.leaves(axes, is_leaf=is_axes), jax.tree.leaves(params), strict=True):
            assert len(names) == leaf.ndim


@pytest.mark.slow
def test_activation_constraints_under_rules_keep_numerics():
    from jax.sharding import NamedSharding

    from sharding.logical import logical_to_spec, use_rules

    auto = jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((2, 4), ("data", "tensor"), axis_types=(auto, auto))
    sharded_names = ("heads", "kv_heads", "mlp", "vocab", "act_heads", "act_kv_heads", "act_mlp", "act_vocab")
    rules = {"batch": "data", **dict.fromkeys(sharded_names, "tensor")}
    config = get_preset("tiny", num_heads=8, num_kv_heads=4, head_dim=16)
    params = init_params(config, jax.random.key(4))
    ids = jnp.asarray(np.random.default_rng(8).integers(0, 256, size=(4, 16)))
    ref = token_logprobs(params, config, ids)
    shardings = jax.tree.map(
        lambda a: NamedSharding(mesh, logical_to_spec(a, rules)),
        param_logical_axes(config),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    sharded = jax.device_put(params, shardings)
    with use_rules(mesh, rules):
        got = jax.jit(lambda p, i: token_logprobs(p, config, i))(sharded, ids)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5)


def test_forward_returns_hidden_states_in_compute_dtype():
    config = get_preset("tiny", dtype="bfloat16")
    params = init_params(config, jax.random.key(0))
    hidden = forward(params, config, jnp.zeros((2, 8), jnp.int32))
    assert hidden.shape == (2, 8, config.hidden_size) and hidden.dtype == jnp.bfloat16
    logp = token_logprobs(params, config, jnp.zeros((2, 8), jnp.int32))
    assert logp.dtype == jnp.float32 and bool(jnp.isfinite(logp).all())
