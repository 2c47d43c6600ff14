"""Fused Pallas flash attention (interpret mode on CPU) equals the blockwise reference kernel.

Outputs, lse and gradients (through out and lse) at 1e-5 in float32, with packed segments and
padding, GQA ratios 1, 4 and 7, lengths that are no multiple of the blocks; context-parallel ring
attention on top of it; and the real GPU lowering (Triton IR for CUDA, built here without a GPU).
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sharding import make_context_attention, make_mesh, make_rules, reorder_for_context, restore_order
from sharding.errors import ShardingError
from sharding.flash import flash_attention, resolve_impl
from sharding.pallas_flash import Blocks, pallas_flash_attention

SMALL = Blocks(fwd_q=32, fwd_kv=16, bwd_q=16, bwd_kv=32)  # sequences pad to a multiple of 32


def packed_rows(b, t, seed):
    """Positions and segment ids: random-length segments per row, then padding (segment 0)."""
    rng = np.random.default_rng(seed)
    pos, seg = np.zeros((b, t), np.int32), np.zeros((b, t), np.int32)
    for r in range(b):
        start, sid = 0, 1
        while start < t - 5:
            n = min(int(rng.integers(3, t // 2)), t - 5 - start)
            pos[r, start : start + n], seg[r, start : start + n] = np.arange(n), sid
            start, sid = start + n, sid + 1
    return jnp.asarray(pos), jnp.asarray(seg)


def qkv(b, t, s, h, kvh, d, seed):
    rng = np.random.default_rng(seed)
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    return f(b, t, h, d), f(b, s, kvh, d), f(b, s, kvh, d)


def value_and_grads(impl, q, k, v, qpos, kpos, qseg, kseg, **kw):
    def loss(q, k, v):
        out, lse = flash_attention(
            q,
            k,
            v,
            q_positions=qpos,
            kv_positions=kpos,
            q_segment_ids=qseg,
            kv_segment_ids=kseg,
            impl=impl,
            **kw,
        )
        seen = lse > -1e29  # rows that see a key; the others carry the constant NEG
        return jnp.sum(out * jnp.sin(out)) + 0.3 * jnp.sum(jnp.where(seen, lse, 0.0)), (out, lse)

    return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)


@pytest.mark.slow
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 1), (14, 2)])  # GQA ratios 1, 4, 7
def test_pallas_matches_blockwise_reference(heads, kv_heads):
    b, t, d = 2, 75, 16  # 75: no multiple of any block
    q, k, v = qkv(b, t, t, heads, kv_heads, d, seed=heads)
    pos, seg = packed_rows(b, t, seed=heads)
    args = (q, k, v, pos, pos, seg, seg)
    (_, (ref_out, ref_lse)), ref_grads = value_and_grads("blockwise", *args, block_q=25, block_kv=25)
    (_, (out, lse)), grads = value_and_grads("pallas", *args, pallas_blocks=SMALL)
    np.testing.assert_allclose(out, ref_out, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-5, rtol=1e-5)
    for name, g, r in zip("qkv", grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")
    padding = np.asarray(seg) == 0
    assert float(jnp.abs(out).max(-1).max(-1)[padding].max()) == 0.0  # rows that see nothing are 0


@pytest.mark.slow
def test_pallas_queries_over_longer_keys():
    """A query chunk against a longer key range (all-gathered context), positions offset."""
    b, t, s, d = 1, 40, 75, 16
    q, k, v = qkv(b, t, s, 8, 2, d, seed=5)
    kpos, kseg = packed_rows(b, s, seed=5)
    qpos, qseg = kpos[:, 30:70], kseg[:, 30:70]
    args = (q, k, v, qpos, kpos, qseg, kseg)
    (_, (ref_out, ref_lse)), ref_grads = value_and_grads("blockwise", *args, block_q=20, block_kv=25)
    (_, (out, lse)), grads = value_and_grads("pallas", *args, pallas_blocks=SMALL)
    np.testing.assert_allclose(out, ref_out, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_ring_context_attention_on_pallas_kernel():
    mesh = make_mesh({"data": 4, "context": 2})
    rules = make_rules({"batch": "data"})
    b, t, d = 4, 64, 16
    q, k, v = qkv(b, t, t, 4, 2, d, seed=7)
    pos, seg = packed_rows(b, t, seed=7)
    z = [reorder_for_context(x, 2) for x in (q, k, v, pos, seg)]

    def loss(impl):
        attn = make_context_attention(mesh, rules, "ring", block=16, impl=impl)

        def f(q, k, v):
            out = attn(q, k, v, q_positions=z[3], kv_positions=z[3], q_segment_ids=z[4], kv_segment_ids=z[4])
            return jnp.sum(jnp.sin(restore_order(out, 2))), out

        return jax.jit(jax.value_and_grad(f, (0, 1, 2), has_aux=True))(*z[:3])

    (_, ref_out), ref_grads = loss("blockwise")
    (_, out), grads = loss("pallas")
    np.testing.assert_allclose(out, ref_out, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5)


def test_lowers_to_triton_for_cuda_at_qwen_shapes():
    """The GPU path itself: forward and backward lower to three Triton kernels for CUDA (bf16,
    head_dim 128, Qwen2.5-7B's 28/4 heads), built from this CPU-only machine."""
    b, t, h, kvh, d = 1, 1000, 28, 4, 128
    sds = jax.ShapeDtypeStruct

    def loss(q, k, v, pos, seg):
        out, lse = pallas_flash_attention(
            q, k, v, q_positions=pos, kv_positions=pos, q_segment_ids=seg, kv_segment_ids=seg, scale=d**-0.5
        )
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(lse)

    kv = sds((b, t, kvh, d), jnp.bfloat16)
    traced = jax.jit(jax.grad(loss, (0, 1, 2))).trace(
        sds((b, t, h, d), jnp.bfloat16), kv, kv, sds((b, t), jnp.int32), sds((b, t), jnp.int32)
    )
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    for kernel in ("jaxswe_flash_fwd", "jaxswe_flash_dq", "jaxswe_flash_dkv"):
        assert kernel in text
    assert text.count("xla.gpu.triton") == 3


def test_impl_selection():
    assert resolve_impl("auto") == "blockwise"  # this machine has no NVIDIA GPU
    # "auto" follows the compile target: a deviceless H200 topology's devices (what
    # bench/bench_planner.py compiles for) get the fused kernel, this host's CPU devices do not
    h200 = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")
    assert resolve_impl("auto", [h200]) == "pallas" and resolve_impl("auto", jax.devices()) == "blockwise"
    assert resolve_impl("pallas") == "pallas"
    with pytest.raises(ShardingError, match="impl"):
        resolve_impl("cuda")
    with pytest.raises(ValueError, match="power of two"):
        Blocks(fwd_q=48)


@pytest.mark.slow
def test_model_gradients_through_pallas_attention_match_blockwise():
    """The training path: tiny Qwen2 with full remat in a layer scan, packed rows, sharded over 8."""
    from jaxswe.model import get_preset, init_params
    from jaxswe.train import policy_logprobs

    cfg = get_preset("tiny", remat="full", attention_block=16)
    params = init_params(cfg, jax.random.key(0))
    b, t = 8, 40
    pos, seg = packed_rows(b, t, seed=3)
    ids = jax.random.randint(jax.random.key(1), (b, t), 0, cfg.vocab_size)
    mesh, rules = make_mesh({"data": 8}), make_rules({"batch": "data"})

    def grads(impl):
        attn = make_context_attention(mesh, rules, "ring", block=cfg.attention_block, impl=impl)
        loss = lambda p: jnp.sum(policy_logprobs(p, cfg, ids, pos, seg, attention_fn=attn)[0])
        return jax.jit(jax.value_and_grad(loss))(params)

    (ref_loss, ref), (loss, got) = grads("blockwise"), grads("pallas")
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-4)
