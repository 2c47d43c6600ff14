"""The parameter pytree: layout, initialization, logical axis names and parameter count.

Layout (plain nested dicts; every per-layer array is stacked on a leading `layers` axis L):
    embed        [V, E]
    layers/attn_norm [L, E]     layers/mlp_norm [L, E]
    layers/wq    [L, E, H, D]   layers/bq [L, H, D]
    layers/wk    [L, E, Hkv, D] layers/bk [L, Hkv, D]
    layers/wv    [L, E, Hkv, D] layers/bv [L, Hkv, D]
    layers/wo    [L, H, D, E]
    layers/w_gate [L, E, F]     layers/w_up [L, E, F]     layers/w_down [L, F, E]
    final_norm   [E]
    lm_head      [E, V]         (absent when tie_word_embeddings)
Kernels are [in, out] (transposed from Hugging Face's [out, in]).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxswe.model.config import Qwen2Config

Params = dict[str, Any]


def param_shapes(config: Qwen2Config) -> Params:
    """Shape of every parameter, in the pytree layout above."""
    c = config
    e, h, hkv, d, f, n = (
        c.hidden_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.intermediate_size,
        c.num_layers,
    )
    shapes: Params = {
        "embed": (c.vocab_size, e),
        "layers": {
            "attn_norm": (n, e),
            "wq": (n, e, h, d),
            "bq": (n, h, d),
            "wk": (n, e, hkv, d),
            "bk": (n, hkv, d),
            "wv": (n, e, hkv, d),
            "bv": (n, hkv, d),
            "wo": (n, h, d, e),
            "mlp_norm": (n, e),
            "w_gate": (n, e, f),
            "w_up": (n, e, f),
            "w_down": (n, f, e),
        },
        "final_norm": (e,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head"] = (e, c.vocab_size)
    return shapes


def param_logical_axes(config: Qwen2Config) -> Params:
    """Logical axis names of every parameter (same structure as the params) for sharding rules."""
    axes: Params = {
        "embed": ("vocab", "embed"),
        "layers": {
            "attn_norm": ("layers", None),
            "wq": ("layers", "embed", "heads", "head_dim"),
            "bq": ("layers", "heads", "head_dim"),
            "wk": ("layers", "embed", "kv_heads", "head_dim"),
            "bk": ("layers", "kv_heads", "head_dim"),
            "wv": ("layers", "embed", "kv_heads", "head_dim"),
            "bv": ("layers", "kv_heads", "head_dim"),
            "wo": ("layers", "heads", "head_dim", "embed"),
            "mlp_norm": ("layers", None),
            "w_gate": ("layers", "embed", "mlp"),
            "w_up": ("layers", "embed", "mlp"),
            "w_down": ("layers", "mlp", "embed"),
        },
        "final_norm": (None,),
    }
    if not config.tie_word_embeddings:
        axes["lm_head"] = ("embed", "vocab")
    return axes


def _is_shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def init_params(config: Qwen2Config, rng: jax.Array) -> Params:
    """Random parameters like transformers initializes them: N(0, 0.02) kernels, zero biases, unit norms."""
    shapes = param_shapes(config)
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=_is_shape)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree.flatten_with_path(shapes, is_leaf=_is_shape)[0]]
    keys = jax.random.split(rng, len(leaves))
    dtype = jnp.dtype(config.param_dtype)
    out = []
    for path, shape, key in zip(paths, leaves, keys, strict=True):
        if "norm" in path:
            out.append(jnp.ones(shape, dtype))
        elif path.endswith("['bq']") or path.endswith("['bk']") or path.endswith("['bv']"):
            out.append(jnp.zeros(shape, dtype))
        else:
            out.append((0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype))
    return jax.tree.unflatten(treedef, out)


def count_params(config: Qwen2Config) -> int:
    """Number of parameters, from abstract shapes (nothing is allocated)."""
    abstract = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(abstract)))
