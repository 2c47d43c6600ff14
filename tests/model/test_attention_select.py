"""`model.attention` selects the kernel in the train step, the recompute pass, prefill and decode;
the one flash kernel (sharding.flash) equals the dense reference; bad settings give one error."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import ROOT

import jaxswe.model.attention as attention
from jaxswe.config import ConfigError, load_config
from jaxswe.model import ModelConfigError, decode_step, get_preset, init_cache, init_params, prefill
from jaxswe.model.attention import attention_from_config
from jaxswe.train import init_train_state, make_compute_logprobs, make_sft_step
from sharding import make_mesh, make_rules

B, T = 4, 20  # T is no multiple of the block (8): the flash kernel pads
TOY = str(ROOT / "configs" / "toy-rl.yaml")
CFG = get_preset("tiny", vocab_size=64, attention_block=8, logprob_chunk=16)


def packed_batch(seed=0):
    """Two segments per row, padding at the end of some rows."""
    rng = np.random.default_rng(seed)
    seg, pos = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
    for r in range(B):
        a = int(rng.integers(4, 10))
        b = int(rng.integers(a + 3, T + 1))
        seg[r, :a], seg[r, a:b] = 1, 2
        pos[r, :a], pos[r, a:b] = np.arange(a), np.arange(b - a)
    return {
        "input_ids": rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32),
        "positions": pos,
        "segment_ids": seg,
        "loss_mask": ((rng.random((B, T)) > 0.3) & (seg > 0)).astype(np.float32),
    }


@pytest.mark.slow
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_flash_kernel_equals_dense_in_outputs_and_gradients(jit):
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=(2, T, h, 16)), jnp.float32) for h in (4, 2, 2))
    b = packed_batch()
    pos, seg = jnp.asarray(b["positions"][:2]), jnp.asarray(b["segment_ids"][:2])

    def loss(fn, q, k, v):
        out = fn(q, k, v, q_positions=pos, kv_positions=pos, q_segment_ids=seg, kv_segment_ids=seg)
        return jnp.sum(out * jnp.cos(out)), out

    def run(kind):
        f = jax.value_and_grad(
            functools.partial(loss, attention_from_config(kind, 8)), (0, 1, 2), has_aux=True
        )
        return (jax.jit(f) if jit else f)(q, k, v)

    (_, ref_out), ref_grads = run("dense")
    (_, out), grads = run("blockwise")
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5)
    assert float(jnp.abs(ref_out[seg == 0]).max()) == 0.0 == float(jnp.abs(out[seg == 0]).max())


def _sft_step(kind):
    cfg = CFG.replace(attention=kind)
    mesh = make_mesh({"fsdp": 2}, devices=jax.devices()[:2])
    return make_sft_step(cfg, optax.sgd(1.0), mesh, make_rules())


@pytest.mark.slow
def test_model_attention_reaches_the_train_step():
    params = init_params(CFG, jax.random.key(0))
    batch = packed_batch()
    texts, results = {}, {}
    for kind in ("dense", "blockwise"):
        step = _sft_step(kind)
        state = init_train_state(params, optax.sgd(1.0), step.state_shardings)
        texts[kind] = step.jitted.lower(state, batch).as_text()
        results[kind] = step(state, batch)
    # sgd(1): new params = params - grads, so equal params mean equal gradients
    (dense_state, dense_m), (flash_state, flash_m) = results["dense"], results["blockwise"]
    np.testing.assert_allclose(flash_m["loss"], dense_m["loss"], atol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), flash_state.params, dense_state.params
    )
    assert float(flash_m["grad_norm"]) > 0
    # the kernels really differ in the program: the blockwise kernel skips empty blocks with a
    # conditional per block pair, dense has none
    assert "stablehlo.case" in texts["blockwise"] and "stablehlo.case" not in texts["dense"]


@pytest.mark.slow
def test_model_attention_reaches_the_recompute_pass():
    params = init_params(CFG, jax.random.key(2))
    batch = {k: v for k, v in packed_batch(3).items() if k != "loss_mask"}
    mesh, rules = make_mesh({"fsdp": 2}, devices=jax.devices()[:2]), make_rules()
    fns = {
        kind: make_compute_logprobs(CFG.replace(attention=kind), mesh, rules)
        for kind in ("dense", "blockwise", "auto", "pallas")
    }
    texts = {kind: fn.jitted.lower(params, batch).as_text() for kind, fn in fns.items()}
    assert "stablehlo.case" in texts["blockwise"] and "stablehlo.case" not in texts["dense"]
    assert len({texts["dense"], texts["blockwise"], texts["pallas"]}) == 3  # Pallas: interpret mode
    assert texts["auto"] == texts["blockwise"]  # auto is blockwise off NVIDIA GPUs
    (logp_d, ent_d, _), (logp_b, ent_b, _) = (fns[k](params, batch) for k in ("dense", "blockwise"))
    np.testing.assert_allclose(logp_b, logp_d, atol=1e-5)
    np.testing.assert_allclose(ent_b, ent_d, atol=1e-5)


def _spy(monkeypatch, name, calls, **fixed):
    fn = getattr(attention, name)

    def spied(*args, **kwargs):
        calls.append(name)
        return fn(*args, **kwargs, **fixed)

    monkeypatch.setattr(attention, name, spied)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dense", "blockwise", "cudnn"])
def test_prefill_and_decode_use_model_attention(monkeypatch, kind):
    """Each kind's kernel runs in prefill and decode and gives the dense logits; cuDNN's call
    (per-row lengths from right-padded segment ids) runs with XLA's implementation on CPU."""
    calls = []
    _spy(monkeypatch, "dense_attention", calls)
    _spy(monkeypatch, "flash_attention", calls)
    _spy(monkeypatch, "cudnn_attention", calls, **({"implementation": "xla"} if kind == "cudnn" else {}))
    params = init_params(CFG, jax.random.key(4))
    params = jax.tree.map(lambda x: x + 0.02 * jax.random.normal(jax.random.key(5), x.shape), params)
    prompts = np.random.default_rng(6).integers(0, 64, (2, 9)) * (np.arange(9)[None] < np.array([[5], [9]]))
    lengths = jnp.asarray([5, 9])

    def run(cfg):  # fresh jitted functions: every run traces (and so calls) its kernel again
        fill = jax.jit(lambda p, ids, n, c: prefill(p, cfg, ids, n, c))
        step = jax.jit(lambda p, tok, c: decode_step(p, cfg, tok, c))
        logits, cache = fill(params, jnp.asarray(prompts), lengths, init_cache(cfg, 2, 24, jnp.float32))
        out = [logits]
        for token in ([3, 7], [11, 2]):
            logits, cache = step(params, jnp.asarray(token), cache)
            out.append(logits)
        return np.stack(out)

    got = run(CFG.replace(attention=kind))
    name = {"dense": "dense_attention", "blockwise": "flash_attention", "cudnn": "cudnn_attention"}[kind]
    assert calls == [name] * 2, calls  # traced once in prefill's layer, once in decode's
    np.testing.assert_allclose(got, run(CFG.replace(attention="dense")), atol=1e-5)


def test_cudnn_refuses_shapes_it_cannot_express():
    q = jnp.zeros((1, 4, 4, 16))
    kv = jnp.zeros((1, 6, 2, 16))
    pos = jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(ModelConfigError, match="T == S or one query"):
        attention.cudnn_attention(q, kv, kv, q_positions=pos, kv_positions=jnp.zeros((1, 6), jnp.int32))


def test_bad_attention_values_and_combinations_give_one_clear_error():
    with pytest.raises(ModelConfigError, match="attention 'flash' not in"):
        get_preset("tiny", attention="flash")
    with pytest.raises(ConfigError, match="model.attention"):
        load_config(TOY, ["model.attention=flash"])
    assert load_config(TOY, ["model.attention=blockwise"]).model.attention == "blockwise"
    rules, context_mesh = make_rules(), make_mesh({"fsdp": 2, "context": 4})
    with pytest.raises(ModelConfigError, match="'dense' has no context-parallel form"):
        make_sft_step(CFG.replace(attention="dense"), optax.sgd(1.0), context_mesh, rules)
    with pytest.raises(ModelConfigError, match="'cudnn' cannot train"):
        make_compute_logprobs(CFG.replace(attention="cudnn"), make_mesh({"fsdp": 8}), rules)
