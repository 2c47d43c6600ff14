"""Vocabulary-sized work without vocabulary-sized buffers: the embedding lookup and the LM head's
per-token statistics, with the collectives written out (`jax.shard_map`) when rules are active.

The [V, E] table and the [E, V] head are sharded on E over the `embed` rule's axes (FSDP) and on
V over the `vocab` rule's axes. Left to the partitioner, a lookup all-gathers the whole float32
table on every device and both gradients are formed as whole float32 [V, E] matrices before they
are reduce-scattered. Here:
- `embed_lookup`: each device gathers the token ids of its E-group (integers), looks up its own
  E-columns, and `all_to_all`s the rows back to the tokens' devices. The gradient is a
  scatter-add into the local [V/tp, E/n] shard.
- `vocab_stats`: the vocabulary is walked in slabs. Each slab of the head is all-gathered in the
  compute dtype, the logits of every local token against it ([N, Vs] float32) update running
  log-sum-exp moments; the backward pass walks the slabs again and reduce-scatters each slab's
  weight gradient as soon as it is formed, so one [E, Vs] gradient slab exists at a time.
Outside `sharding.use_rules` (one device) the same code runs with no collectives.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from sharding.errors import ShardingError
from sharding.logical import active_rules
from sharding.rules import spec_for_shape


def _axes(entry) -> tuple[str, ...]:
    return (entry,) if isinstance(entry, str) else tuple(entry or ())


@dataclass(frozen=True)
class VocabLayout:
    """Which mesh axes shard the table's E and V dims and the tokens' batch and length dims."""

    mesh: Mesh | None = None
    table: PartitionSpec = PartitionSpec()  # of the table as stored ([V, E] or [E, V])
    tokens: PartitionSpec = PartitionSpec()  # of [B, T] ids
    e_axes: tuple[str, ...] = ()
    v_axes: tuple[str, ...] = ()
    batch_axes: tuple[str, ...] = ()
    length_axes: tuple[str, ...] = ()

    @property
    def hidden(self) -> PartitionSpec:
        return PartitionSpec(*self.tokens, None)

    @property
    def reduce_axes(self) -> tuple[str, ...]:
        """Axes that split the tokens but not the table: gradients are summed over them."""
        return tuple(a for a in (*self.batch_axes, *self.length_axes) if a not in self.e_axes)


def layout(table_shape, table_names, tokens_shape) -> VocabLayout:
    """The VocabLayout under the active rules (no axes outside `use_rules`)."""
    active = active_rules()
    if active is None:
        return VocabLayout()
    mesh, rules = active
    sizes = dict(mesh.shape)
    table = spec_for_shape(table_names, table_shape, sizes, rules)
    tokens = spec_for_shape(("batch", "length"), tokens_shape, sizes, rules)
    by_name = dict(zip(table_names, table, strict=True))
    lay = VocabLayout(
        mesh, table, tokens, _axes(by_name["embed"]), _axes(by_name["vocab"]), _axes(tokens[0]),
        _axes(tokens[1]),
    )  # fmt: skip
    if shared := set(lay.v_axes) & {*lay.batch_axes, *lay.length_axes}:
        raise ShardingError(
            f"mesh axes {sorted(shared)} split both the vocabulary and the tokens; map the `vocab` rule "
            "to axes the `batch` and `length` rules do not use (e.g. tensor)"
        )
    return lay


def _run(lay: VocabLayout, fn, in_specs, out_specs, *args):
    if lay.mesh is None:
        return fn(*args)
    return jax.shard_map(fn, mesh=lay.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*args)


def _index(axes: tuple[str, ...]):
    return jax.lax.axis_index(axes) if axes else 0


def _psum(x, axes: tuple[str, ...]):
    return jax.lax.psum(x, axes) if axes else x


def _token_dim(lay: VocabLayout, axis: str) -> int | None:
    return 0 if axis in lay.batch_axes else 1 if axis in lay.length_axes else None


def _group_ids(lay: VocabLayout, ids_bt):
    """The ids of every device that holds other E-columns of the same tokens (E axes in order)."""
    for a in lay.e_axes:
        if (dim := _token_dim(lay, a)) is not None:
            ids_bt = jax.lax.all_gather(ids_bt, a, axis=dim, tiled=True)
    return ids_bt


def _local_vocab(lay: VocabLayout, ids, rows: int):
    """(ids relative to this device's vocab rows, clipped into range; whether they are its own)."""
    local = ids - _index(lay.v_axes) * rows
    mine = (local >= 0) & (local < rows)
    return jnp.where(mine, local, 0), mine


# -- embedding lookup --------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4))
def _lookup(lay, table_ve, ids_bt, out_dtype, grad_dtype):
    return _lookup_fwd(lay, table_ve, ids_bt, out_dtype, grad_dtype)[0]


def _lookup_fwd(lay, table_ve, ids_bt, out_dtype, grad_dtype):
    def local(table, ids):
        ids = _group_ids(lay, ids)
        rows, mine = _local_vocab(lay, ids, table.shape[0])
        x = jnp.where(mine[..., None], jnp.take(table, rows, axis=0), 0).astype(out_dtype)
        x = _psum(x, lay.v_axes)
        for a in reversed(lay.e_axes):  # minor E axis first: each step concatenates whole E slabs
            dim = _token_dim(lay, a)
            x = (jax.lax.all_gather(x, a, axis=2, tiled=True) if dim is None
                 else jax.lax.all_to_all(x, a, dim, 2, tiled=True))  # fmt: skip
        return x

    out = _run(lay, local, (lay.table, lay.tokens), lay.hidden, table_ve, ids_bt)
    return out, (table_ve, ids_bt)


def _lookup_bwd(lay, out_dtype, grad_dtype, res, dx_bte):
    table_ve, ids_bt = res

    def local(table, ids, dx):
        ids = _group_ids(lay, ids)
        for a in lay.e_axes:  # the forward's all_to_alls undone, major E axis first
            dim = _token_dim(lay, a)
            if dim is None:  # the tokens are replicated over `a`: this device's E-columns
                size = dx.shape[2] // jax.lax.axis_size(a)
                dx = jax.lax.dynamic_slice_in_dim(dx, jax.lax.axis_index(a) * size, size, axis=2)
            else:
                dx = jax.lax.all_to_all(dx, a, 2, dim, tiled=True)
        rows, mine = _local_vocab(lay, ids, table.shape[0])
        dx = jnp.where(mine[..., None], dx.astype(grad_dtype), 0)
        grad = jnp.zeros(table.shape, grad_dtype).at[rows.reshape(-1)].add(dx.reshape(-1, dx.shape[-1]))
        return _psum(grad, lay.reduce_axes).astype(table.dtype)

    grad = _run(lay, local, (lay.table, lay.tokens, lay.hidden), lay.table, table_ve, ids_bt, dx_bte)
    return grad, None


_lookup.defvjp(_lookup_fwd, _lookup_bwd)


def embed_lookup(table_ve, ids_bt, out_dtype, grad_dtype=jnp.float32):
    """table[ids] as [B, T, E] in `out_dtype`; the table's gradient is summed in `grad_dtype`."""
    lay = layout(table_ve.shape, ("vocab", "embed"), ids_bt.shape)
    with jax.named_scope("embed_lookup"):  # names its ops in HLO dumps (jaxswe.plan.compiled_memory)
        return _lookup(lay, table_ve, ids_bt, jnp.dtype(out_dtype), jnp.dtype(grad_dtype))


# -- LM head statistics ------------------------------------------------------------------------
def _slabs(vocab: int, tokens: int, chunk: int) -> tuple[int, int]:
    """(slab count, slab width): about `chunk` x vocab logits per slab of all `tokens` tokens."""
    width = -(-vocab // min(max(-(-tokens // chunk), 1), vocab))
    return -(-vocab // width), width


def _head_slabs(w_ev, transposed: bool, n: int, width: int):
    """The local head as [n, E_local, width] slabs (zero-padded past the vocabulary)."""
    w = w_ev.T if transposed else w_ev
    w = jnp.pad(w, ((0, 0), (0, n * width - w.shape[1])))
    return jnp.moveaxis(w.reshape(w.shape[0], n, width), 1, 0)


def _slab_logits(lay, h_ne, w_slab, s, width, vocab_local):
    """float32 logits [N, width] of slab `s`, and which of its columns are real vocabulary."""
    w = w_slab.astype(h_ne.dtype)
    if lay.e_axes:
        w = jax.lax.all_gather(w, lay.e_axes, axis=0, tiled=True)
    logits = jnp.einsum("ne,ev->nv", h_ne, w, preferred_element_type=jnp.float32)
    cols = s * width + jnp.arange(width)
    return logits, cols < vocab_local, w


def _moments(lay, h_ne, targets_n, w_slabs, vocab_local):
    """Per token: max logit m, sum exp(l - m), and its first two moments of (l - m), and the
    target's logit, over this device's vocabulary slabs, then combined over the vocab axes."""
    n_tok = h_ne.shape[0]
    width = w_slabs.shape[2]
    local_targets, mine = _local_vocab(lay, targets_n, vocab_local)

    def step(carry, xs):
        m, s0, s1, s2, tgt = carry
        w_slab, s = xs
        logits, real, _ = _slab_logits(lay, h_ne, w_slab, s, width, vocab_local)
        hit = (s * width + jnp.arange(width))[None, :] == local_targets[:, None]
        tgt = tgt + jnp.sum(jnp.where(hit & mine[:, None], logits, 0.0), axis=-1)
        m_new = jnp.maximum(m, jnp.max(jnp.where(real, logits, -jnp.inf), axis=-1))
        s0, s1, s2 = _rescale(s0, s1, s2, m - m_new)
        z = jnp.where(real, logits - m_new[:, None], 0.0)
        e = jnp.where(real, jnp.exp(z), 0.0)
        return (m_new, s0 + e.sum(-1), s1 + (e * z).sum(-1), s2 + (e * z * z).sum(-1), tgt), None

    zeros = jnp.zeros((n_tok,), jnp.float32)
    init = (jnp.full((n_tok,), -jnp.inf, jnp.float32), zeros, zeros, zeros, zeros)
    (m, s0, s1, s2, tgt), _ = jax.lax.scan(step, init, (w_slabs, jnp.arange(w_slabs.shape[0])))
    if lay.v_axes:
        m_all = jax.lax.pmax(m, lay.v_axes)
        s0, s1, s2 = _psum(_rescale(s0, s1, s2, m - m_all), lay.v_axes)
        m, tgt = m_all, _psum(tgt, lay.v_axes)
    return m, s0, s1, s2, tgt


def _rescale(s0, s1, s2, d):
    """Moments of (l - m_old) re-expressed about m_new = m_old - d (d <= 0; nothing yet: zeros)."""
    d = jnp.where(s0 > 0, d, 0.0)
    scale = jnp.exp(d)
    return scale * s0, scale * (s1 + d * s0), scale * (s2 + 2 * d * s1 + d * d * s0)


def _scatter_e(lay: VocabLayout, dw_ev):
    """This device's E-rows of a gradient slab: summed over the E axes that split the tokens, taken
    as is over those that do not (their devices hold the same tokens: the same gradient)."""
    if not lay.e_axes:
        return dw_ev
    if all(_token_dim(lay, a) is not None for a in lay.e_axes):
        return jax.lax.psum_scatter(dw_ev, lay.e_axes, scatter_dimension=0, tiled=True)
    for a in lay.e_axes:  # major first
        size = dw_ev.shape[0] // jax.lax.axis_size(a)
        if _token_dim(lay, a) is None:
            dw_ev = jax.lax.dynamic_slice_in_dim(dw_ev, jax.lax.axis_index(a) * size, size, axis=0)
        else:
            dw_ev = jax.lax.psum_scatter(dw_ev, a, scatter_dimension=0, tiled=True)
    return dw_ev


def _stats_local(lay, chunk, transposed, h_bte, targets_bt, w):
    b, t, e = h_bte.shape
    h_ne, targets_n = h_bte.reshape(b * t, e), targets_bt.reshape(b * t)
    vocab_local = w.shape[0] if transposed else w.shape[1]
    n, width = _slabs(vocab_local, b * t, chunk)
    m, s0, s1, s2, tgt = _moments(lay, h_ne, targets_n, _head_slabs(w, transposed, n, width), vocab_local)
    lse = m + jnp.log(s0)
    mean_z, mean_z2 = s1 / s0, s2 / s0
    entropy = jnp.log(s0) - mean_z  # lse - E[l]
    variance = mean_z2 - mean_z * mean_z  # Var(log p) = Var(l)
    shape = lambda x: x.reshape(b, t)
    return shape(tgt - lse), shape(entropy), shape(variance), shape(lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 6))
def _stats(lay, chunk, transposed, h_bte, targets_bt, w, grad_dtype):
    return _stats_fwd(lay, chunk, transposed, h_bte, targets_bt, w, grad_dtype)[0]


def _stats_fwd(lay, chunk, transposed, h_bte, targets_bt, w, grad_dtype):
    local = functools.partial(_stats_local, lay, chunk, transposed)
    tok = lay.tokens
    in_specs = (lay.hidden, tok, lay.table)
    logp, entropy, variance, lse = _run(lay, local, in_specs, (tok,) * 4, h_bte, targets_bt, w)
    out = (logp, entropy, jnp.maximum(variance, 0.0))
    return out, (h_bte, targets_bt, w, lse, entropy, variance)


def _stats_bwd(lay, chunk, transposed, grad_dtype, res, cotangents):
    h_bte, targets_bt, w = res[:3]
    g_logp, g_entropy, g_var = cotangents

    def local(h, targets, w, lse, entropy, variance, g_logp, g_entropy, g_var):
        b, t, e = h.shape
        h_ne, flat = h.reshape(b * t, e), lambda x: x.reshape(b * t)
        lse, entropy, variance, g_logp, g_entropy = map(flat, (lse, entropy, variance, g_logp, g_entropy))
        g_var = jnp.where(variance > 0, flat(g_var), 0.0)  # the forward clamps at 0
        vocab_local = w.shape[0] if transposed else w.shape[1]
        n, width = _slabs(vocab_local, b * t, chunk)
        local_targets, mine = _local_vocab(lay, flat(targets), vocab_local)

        def step(dh, xs):
            w_slab, s = xs
            logits, real, w_full = _slab_logits(lay, h_ne, w_slab, s, width, vocab_local)
            # d/dl_j of log p(y) = [j = y] - p_j; of H = -p_j c_j; of Var = p_j (c_j^2 + 2 c_j - Var),
            # with c_j = log p_j + H (log p_j centred on its mean under p)
            logp = logits - lse[:, None]
            p = jnp.where(real, jnp.exp(logp), 0.0)
            c = logp + entropy[:, None]
            d_var = c * c + 2 * c - variance[:, None]
            dl = p * (-g_logp[:, None] - g_entropy[:, None] * c + g_var[:, None] * d_var)
            hit = (s * width + jnp.arange(width))[None, :] == local_targets[:, None]
            dl = (dl + jnp.where(hit & mine[:, None], g_logp[:, None], 0.0)).astype(h_ne.dtype)
            dh = dh + jnp.einsum("nv,ev->ne", dl, w_full, preferred_element_type=jnp.float32)
            dw = jnp.einsum("ne,nv->ev", h_ne, dl, preferred_element_type=grad_dtype)
            return dh, _psum(_scatter_e(lay, dw), lay.reduce_axes)

        slabs = _head_slabs(w, transposed, n, width)
        dh, dw = jax.lax.scan(step, jnp.zeros(h_ne.shape, jnp.float32), (slabs, jnp.arange(n)))
        dw = jnp.moveaxis(dw, 0, 1).reshape(dw.shape[1], n * width)[:, :vocab_local].astype(w.dtype)
        dh = _psum(dh, lay.v_axes).astype(h.dtype).reshape(b, t, e)
        return dh, dw.T if transposed else dw

    tok = lay.tokens
    dh, dw = _run(lay, local, (lay.hidden, tok, lay.table, *(tok,) * 6), (lay.hidden, lay.table),
                  h_bte, targets_bt, w, *res[3:], g_logp, g_entropy, g_var)  # fmt: skip
    return dh, None, dw


_stats.defvjp(_stats_fwd, _stats_bwd)


def vocab_stats(hidden_bte, unembed, targets_bt, *, chunk: int, tied: bool, grad_dtype=jnp.float32):
    """Per token of `hidden_bte` ([B, T, E]): (log p(target), entropy, variance of the surprisal
    -log p), each float32 [B, T], under softmax(hidden @ head). `unembed` is the [E, V] head, or
    the [V, E] embedding table when `tied`. About `chunk` x V float32 logits per device exist at a
    time; the head's gradient is formed in `grad_dtype`, one [E, V/slabs] slab at a time."""
    names = ("vocab", "embed") if tied else ("embed", "vocab")
    lay = layout(unembed.shape, names, targets_bt.shape)
    with jax.named_scope("vocab_stats"):
        return _stats(lay, chunk, tied, hidden_bte, targets_bt, unembed, jnp.dtype(grad_dtype))
