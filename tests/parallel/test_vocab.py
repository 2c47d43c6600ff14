"""sharding.vocab: the hand-sharded embedding lookup and LM-head statistics equal a dense float64
reference in value and gradient (log p, entropy and surprisal variance each weighted, so every
term of the custom backward pass counts), on one device and on meshes that split the table's E
and V dims and the tokens in the ways the rules allow. The train-step equality tests
(test_train_step.py) check the same path inside the real DAPO step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from sharding import ShardingError, embed_lookup, make_rules, use_rules, vocab_stats

B, T, E, V = 4, 16, 16, 40


def _inputs():
    k = jax.random.split(jax.random.PRNGKey(0), 8)
    table = jax.random.normal(k[0], (V, E), jnp.float32)
    head = 0.5 * jax.random.normal(k[1], (E, V), jnp.float32)
    ids, targets = (jax.random.randint(k[i], (B, T), 0, V) for i in (2, 3))
    weights = [jax.random.normal(k[4 + i], (B, T) if i < 3 else (B, T, E)) for i in range(4)]
    return table, head, ids, targets, weights


def _objective(table, head, ids, targets, weights, *, tied, reference, chunk=9):
    """sum of w0 log p + w1 H + w2 Var + w3 . embedding: one scalar that every output feeds."""
    if reference:
        x = table[ids]
        logp_btv = jax.nn.log_softmax(x @ (table.T if tied else head), axis=-1)
        p = jnp.exp(logp_btv)
        entropy = -(p * logp_btv).sum(-1)
        stats = (jnp.take_along_axis(logp_btv, targets[..., None], -1)[..., 0], entropy,
                 (p * logp_btv**2).sum(-1) - entropy**2)  # fmt: skip
    else:
        x = embed_lookup(table, ids, jnp.float32)
        stats = vocab_stats(x, table if tied else head, targets, chunk=chunk, tied=tied)
    return sum((w * s).sum() for w, s in zip(weights[:3], stats, strict=True)) + (weights[3] * x).sum()


MESHES = {
    "one device": None,
    "data2-fsdp2-context2": ((2, 2, 2, 1), None),
    "fsdp2-context2-tensor2": ((1, 2, 2, 2), None),
    "embed over fsdp+tensor": ((1, 2, 2, 2), {"embed": ["fsdp", "tensor"]}),
}


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("mesh", MESHES)
def test_lookup_and_head_stats_equal_float64_reference(mesh, tied):
    table, head, ids, targets, weights = _inputs()
    with jax.enable_x64(True):
        want, want_grads = jax.value_and_grad(
            lambda t, h: _objective(t, h, ids, targets, weights, tied=tied, reference=True), argnums=(0, 1)
        )(np.asarray(table, np.float64), np.asarray(head, np.float64))
        want, want_grads = float(want), [np.asarray(g) for g in want_grads]
        assert want_grads[0].dtype == np.float64

    def ours(t, h):
        return jax.value_and_grad(
            lambda a, b: _objective(a, b, ids, targets, weights, tied=tied, reference=False), argnums=(0, 1)
        )(t, h)

    if MESHES[mesh] is None:
        runs = {"eager": ours, "jit": jax.jit(ours)}
    else:
        shape, overrides = MESHES[mesh]
        m = Mesh(np.array(jax.devices()[:8]).reshape(shape), ("data", "fsdp", "context", "tensor"))

        def sharded(t, h):
            with use_rules(m, make_rules(overrides)):
                return ours(t, h)

        runs = {"jit": jax.jit(sharded)}
    for how, run in runs.items():
        got, grads = run(table, head)
        assert float(got) == pytest.approx(want, rel=1e-5), how
        for g, w in zip(grads, want_grads, strict=True):
            np.testing.assert_allclose(g, w, atol=5e-5 * np.abs(w).max(), err_msg=how)


def test_vocab_and_tokens_on_the_same_axis_are_refused():
    table, head, ids, targets, _ = _inputs()
    m = Mesh(np.array(jax.devices()[:2]).reshape(1, 2, 1, 1), ("data", "fsdp", "context", "tensor"))
    rules = make_rules({"vocab": "fsdp", "embed": None})
    with use_rules(m, rules), pytest.raises(ShardingError, match="vocab"):
        vocab_stats(jnp.zeros((B, T, E)), head, targets, chunk=8, tied=False)
