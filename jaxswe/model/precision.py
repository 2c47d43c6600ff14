"""Master weights used in the compute dtype, with their gradients reduced in `grad_dtype`.

With float32 masters and bfloat16 compute, plain `w.astype(bf16)` makes the weight gradient a
bfloat16 dot output, and XLA sums it over the batch-sharded devices (the FSDP reduce-scatter)
in bfloat16, before the cast back to float32. Here the weight-gradient dot writes `grad_dtype`
(float32) directly and biases / norm scales sum their cotangents in `grad_dtype`, so the
cross-device reduction runs in it. When `grad_dtype` is the compute dtype (float32 compute, or
the bfloat16 knob) both functions are the plain cast: nothing changes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _specs(spec: str) -> tuple[str, str, str]:
    ins, out = spec.split("->")
    x, w = ins.split(",")
    return x, w, out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4, 5))
def _einsum_grad_in(spec, x, w, grad_dtype, out_dtype, w_dtype):
    return jnp.einsum(spec, x, w.astype(x.dtype), preferred_element_type=out_dtype)


def _fwd(spec, x, w, grad_dtype, out_dtype, w_dtype):
    w_c = w.astype(x.dtype)  # the residual: the backward pass gathers no second copy
    return jnp.einsum(spec, x, w_c, preferred_element_type=out_dtype), (x, w_c)


def _bwd(spec, grad_dtype, out_dtype, w_dtype, res, g):
    x, w_c = res
    xs, ws, outs = _specs(spec)
    _, x_vjp = jax.vjp(lambda x_: jnp.einsum(spec, x_, w_c, preferred_element_type=out_dtype), x)
    (dx,) = x_vjp(g)
    dw = jnp.einsum(f"{xs},{outs}->{ws}", x, g, preferred_element_type=grad_dtype)
    return dx, dw.astype(w_dtype)


_einsum_grad_in.defvjp(_fwd, _bwd)


def weight_einsum(spec: str, x, w, grad_dtype, *, out_dtype=None):
    """`einsum(spec, x, w cast to x.dtype)` (output `out_dtype`, default x's); w's gradient is a
    `grad_dtype` dot output. `spec` is "x,w->out" with every index of w in x or out."""
    if jnp.dtype(grad_dtype) == x.dtype:
        return jnp.einsum(spec, x, w.astype(x.dtype), preferred_element_type=out_dtype)
    return _einsum_grad_in(spec, x, w, jnp.dtype(grad_dtype), out_dtype, w.dtype)


def broadcast_weight(w, like, grad_dtype):
    """A bias or norm scale `w` in `like`'s dtype, broadcast to `like`'s shape; its gradient is
    summed over the broadcast dims in `grad_dtype` (the same forward values either way)."""
    if jnp.dtype(grad_dtype) == like.dtype:
        return w.astype(like.dtype)
    return jnp.broadcast_to(w.astype(grad_dtype), like.shape).astype(like.dtype)
