"""The blockwise kernel under ``packed_attention``: an online softmax over blocks, and
its FlashAttention-2 gradient, with memory linear in the row length.

Everything here works on one layout, grouped by key/value head: queries
``[batch, K, G, T, H]`` (``G`` query heads share each of the ``K`` key/value heads),
keys and values ``[batch, K, S, H]``, segment ids and positions ``[batch, T]`` and
``[batch, S]``, ``T`` a multiple of ``block_q`` and ``S`` of ``block_kv``. The public
function (``_packed_attention``) validates, gathers over the context axis, pads and
transposes into it.

A pair of blocks (``block_q`` queries, ``block_kv`` keys) is computed only if it may
hold an allowed pair, judged from four numbers per block: its lowest and highest
non-zero segment id, the highest position among its tokens of the highest id and the
lowest position among its tokens of the lowest id. An allowed pair needs one id in both
blocks and, causal, ``(id, position)`` of the query at or after that of the key; so a
pair of blocks whose id ranges do not meet, or whose query block's largest
``(id, position)`` comes before its key block's smallest, holds none and is skipped.
The test only ever skips empty pairs, so it is right under any context layout; in the
row's own order (and in a dual chunk layout, whose chunks are pieces of the row in
order) it is exact for ``pack``'s rows -- a block pair is computed iff it holds an
allowed pair -- and under a striped layout, where a block spans ``cp`` times as many
tokens of the row, it is a looser bound (the mask inside the block stays exact).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32
_INT_MAX = jnp.iinfo(jnp.int32).max


class Bounds(NamedTuple):
    """Per block (``[batch, n]`` each): what the skip test reads."""

    real: jax.Array  # the block holds a token of a document (id > 0)
    id_lo: jax.Array  # lowest non-zero id
    id_hi: jax.Array  # highest id
    pos_at_lo: jax.Array  # lowest position among the tokens of id ``id_lo``
    pos_at_hi: jax.Array  # highest position among the tokens of id ``id_hi``


def bounds(ids: jax.Array, positions: jax.Array, block: int) -> Bounds:
    """The skip test's numbers for each block of ``block`` tokens of ``[batch, T]``."""
    ids = ids.reshape(ids.shape[0], -1, block)
    positions = positions.reshape(ids.shape)
    real = ids > 0
    id_lo = jnp.min(jnp.where(real, ids, _INT_MAX), axis=-1)
    id_hi = jnp.max(jnp.where(real, ids, 0), axis=-1)
    at_lo = real & (ids == id_lo[..., None])
    at_hi = real & (ids == id_hi[..., None])
    pos_at_lo = jnp.min(jnp.where(at_lo, positions, _INT_MAX), axis=-1)
    pos_at_hi = jnp.max(jnp.where(at_hi, positions, -1), axis=-1)
    return Bounds(real.any(axis=-1), id_lo, id_hi, pos_at_lo, pos_at_hi)


def _live(
    q: Bounds, kv: Bounds, b: jax.Array, i: jax.Array, j: jax.Array, causal: bool
) -> jax.Array:
    """May query block ``i`` and key block ``j`` of row ``b`` hold an allowed pair?"""
    q_lo, q_hi, kv_lo, kv_hi = q.id_lo[b, i], q.id_hi[b, i], kv.id_lo[b, j], kv.id_hi[b, j]
    live = q.real[b, i] & kv.real[b, j] & (q_lo <= kv_hi) & (kv_lo <= q_hi)
    if causal:
        same_id = (q_hi == kv_lo) & (q.pos_at_hi[b, i] >= kv.pos_at_lo[b, j])
        live = live & ((q_hi > kv_lo) | same_id)
    return live


def live_pairs(
    q_ids: jax.Array,
    kv_ids: jax.Array,
    q_pos: jax.Array,
    kv_pos: jax.Array,
    block_q: int,
    block_kv: int,
    causal: bool,
) -> jax.Array:
    """``[batch, T / block_q, S / block_kv]``: the pairs of blocks the kernel computes
    (it skips the others), for ``[batch, T]`` and ``[batch, S]`` ids and positions."""
    q, kv = bounds(q_ids, q_pos, block_q), bounds(kv_ids, kv_pos, block_kv)
    b = jnp.arange(q.real.shape[0])[:, None, None]
    i, j = jnp.arange(q.real.shape[1])[:, None], jnp.arange(kv.real.shape[1])
    return _live(q, kv, b, i, j, causal)


def _mask(
    q_ids: jax.Array, kv_ids: jax.Array, q_pos: jax.Array, kv_pos: jax.Array, causal: bool
) -> jax.Array:
    """``[block_q, block_kv]``: may query ``a`` attend key ``b``?"""
    mask = (q_ids[:, None] == kv_ids[None, :]) & (q_ids[:, None] > 0)
    if causal:
        mask = mask & (q_pos[:, None] >= kv_pos[None, :])
    return mask


class _Inputs(NamedTuple):
    """A batch of rows, in the kernel's layout."""

    q: jax.Array  # [B, K, G, T, H]
    k: jax.Array  # [B, K, S, H]
    v: jax.Array  # [B, K, S, H]
    q_ids: jax.Array  # [B, T]
    kv_ids: jax.Array  # [B, S]
    q_pos: jax.Array  # [B, T]
    kv_pos: jax.Array  # [B, S]


@dataclasses.dataclass(frozen=True)
class _Config:
    scale: float
    causal: bool
    block_q: int
    block_kv: int


class _Blocks:
    """The blocks of a batch of rows, and the scores of a pair of them. The loops run
    over (row, block) pairs flattened into one index: one loop level fewer to compile,
    and each row skips its own blocks (a ``vmap`` over rows would make the skip's
    ``cond`` a ``select``, which computes both branches)."""

    def __init__(self, x: _Inputs, cfg: _Config) -> None:
        self.x, self.cfg = x, cfg
        self.q_bounds = bounds(x.q_ids, x.q_pos, cfg.block_q)
        self.kv_bounds = bounds(x.kv_ids, x.kv_pos, cfg.block_kv)
        # inside shard_map a loop's carry must vary over the mesh axes its inputs vary
        # over: zeros made from this scalar do
        self.zero = sum(jnp.zeros_like(a, shape=(), dtype=_F32) for a in x)

    def fill(self, shape: tuple[int, ...], value: float = 0.0) -> jax.Array:
        """A float32 carry of ``shape``, varying as the inputs do."""
        return jnp.full(shape, value, _F32) + self.zero

    @property
    def counts(self) -> tuple[int, int]:
        """Blocks of queries and of keys in a row."""
        return self.x.q.shape[3] // self.cfg.block_q, self.x.k.shape[2] // self.cfg.block_kv

    def live(self, b: jax.Array, i: jax.Array, j: jax.Array) -> jax.Array:
        return _live(self.q_bounds, self.kv_bounds, b, i, j, self.cfg.causal)

    def q_block(self, x: jax.Array, b: jax.Array, i: jax.Array) -> jax.Array:
        """Block ``i`` of row ``b`` of a per-query array (``[B, K, G, T, ...]``, or
        ``[B, T]``)."""
        row = lax.dynamic_index_in_dim(x, b, 0, keepdims=False)
        axis = 0 if row.ndim == 1 else 2
        return lax.dynamic_slice_in_dim(row, i * self.cfg.block_q, self.cfg.block_q, axis)

    def kv_block(self, x: jax.Array, b: jax.Array, j: jax.Array) -> jax.Array:
        """Block ``j`` of row ``b`` of a per-key array (``[B, K, S, H]``, or ``[B, S]``)."""
        row = lax.dynamic_index_in_dim(x, b, 0, keepdims=False)
        axis = 0 if row.ndim == 1 else 1
        return lax.dynamic_slice_in_dim(row, j * self.cfg.block_kv, self.cfg.block_kv, axis)

    def scores(self, b: jax.Array, i: jax.Array, j: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Scaled float32 scores ``[K, G, block_q, block_kv]`` and the pair's mask."""
        x, cfg = self.x, self.cfg
        q, k = self.q_block(x.q, b, i), self.kv_block(x.k, b, j)
        s = jnp.einsum("kgqh,kch->kgqc", q, k, preferred_element_type=_F32) * cfg.scale
        mask = _mask(
            self.q_block(x.q_ids, b, i),
            self.kv_block(x.kv_ids, b, j),
            self.q_block(x.q_pos, b, i),
            self.kv_block(x.kv_pos, b, j),
            cfg.causal,
        )
        return s, mask

    def skip(self, b: jax.Array, i: jax.Array, j: jax.Array, step: Any, carry: Any) -> Any:
        """``step(carry)`` if the pair may hold an allowed pair, else ``carry``."""
        return lax.cond(self.live(b, i, j), step, lambda c: c, carry)


def _forward_pass(x: _Inputs, cfg: _Config) -> tuple[jax.Array, jax.Array]:
    """Output ``[B, K, G, T, H]`` (q's dtype) and log-sum-exp ``[B, K, G, T]``."""
    blocks = _Blocks(x, cfg)
    n_q, n_kv = blocks.counts
    batch, heads, group, _, dim = x.q.shape

    def one_q_block(index: jax.Array) -> tuple[jax.Array, jax.Array]:
        b, i = jnp.divmod(index, n_q)

        def step(j: jax.Array, carry: Any) -> Any:
            m, total, o = carry
            s, mask = blocks.scores(b, i, j)
            m_new = jnp.maximum(m, jnp.max(jnp.where(mask, s, -jnp.inf), axis=-1))
            shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # a row with nothing yet
            p = jnp.where(mask, jnp.exp(s - shift[..., None]), 0.0)
            alpha = jnp.exp(m - shift)
            v = blocks.kv_block(x.v, b, j)
            pv = jnp.einsum("kgqc,kch->kgqh", p.astype(v.dtype), v, preferred_element_type=_F32)
            return m_new, alpha * total + p.sum(axis=-1), alpha[..., None] * o + pv

        def body(j: jax.Array, carry: Any) -> Any:
            return blocks.skip(b, i, j, functools.partial(step, j), carry)

        shape = (heads, group, cfg.block_q)
        init = (blocks.fill(shape, -jnp.inf), blocks.fill(shape), blocks.fill((*shape, dim)))
        m, total, o = lax.fori_loop(0, n_kv, body, init)
        seen = total > 0  # padding, or a query with no key: output 0 (and gradient 0)
        out = jnp.where(seen[..., None], o / jnp.where(seen, total, 1.0)[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, total, 1.0)), 0.0)
        return out.astype(x.q.dtype), lse

    out, lse = lax.map(one_q_block, jnp.arange(batch * n_q))  # [B * n_q, K, G, block_q, ...]
    out = out.reshape(batch, n_q, heads, group, cfg.block_q, dim)
    lse = lse.reshape(batch, n_q, heads, group, cfg.block_q)
    return (
        jnp.moveaxis(out, 1, 3).reshape(x.q.shape),
        jnp.moveaxis(lse, 1, 3).reshape(x.q.shape[:4]),
    )


def _backward_pass(
    x: _Inputs, cfg: _Config, out: jax.Array, lse: jax.Array, d_out: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``dq, dk, dv``: one pass over query blocks for ``dq``, one over key blocks for
    ``dk, dv``, each recomputing the probabilities from the log-sum-exp."""
    blocks = _Blocks(x, cfg)
    n_q, n_kv = blocks.counts
    batch, heads, group, _, dim = x.q.shape
    delta = jnp.sum(d_out.astype(_F32) * out.astype(_F32), axis=-1)  # [B, K, G, T]

    def grads(b: jax.Array, i: jax.Array, j: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Probabilities and score gradients of a pair (``[K, G, bq, bkv]`` each)."""
        s, mask = blocks.scores(b, i, j)
        p = jnp.where(mask, jnp.exp(s - blocks.q_block(lse, b, i)[..., None]), 0.0)
        d_o, v = blocks.q_block(d_out, b, i), blocks.kv_block(x.v, b, j)
        dp = jnp.einsum("kgqh,kch->kgqc", d_o, v, preferred_element_type=_F32)
        ds = p * (dp - blocks.q_block(delta, b, i)[..., None]) * cfg.scale
        return p, ds

    def dq_block(index: jax.Array) -> jax.Array:
        b, i = jnp.divmod(index, n_q)

        def step(j: jax.Array, dq: jax.Array) -> jax.Array:
            _, ds = grads(b, i, j)
            k = blocks.kv_block(x.k, b, j)
            ds_k = jnp.einsum("kgqc,kch->kgqh", ds.astype(k.dtype), k, preferred_element_type=_F32)
            return dq + ds_k

        def body(j: jax.Array, dq: jax.Array) -> jax.Array:
            return blocks.skip(b, i, j, functools.partial(step, j), dq)

        dq = lax.fori_loop(0, n_kv, body, blocks.fill((heads, group, cfg.block_q, dim)))
        return dq.astype(x.q.dtype)

    def dkv_block(index: jax.Array) -> tuple[jax.Array, jax.Array]:
        b, j = jnp.divmod(index, n_kv)

        def step(i: jax.Array, carry: Any) -> Any:
            dk, dv = carry
            p, ds = grads(b, i, j)
            q, d_o = blocks.q_block(x.q, b, i), blocks.q_block(d_out, b, i)
            dv = dv + jnp.einsum(
                "kgqc,kgqh->kch", p.astype(d_o.dtype), d_o, preferred_element_type=_F32
            )
            dk = dk + jnp.einsum(
                "kgqc,kgqh->kch", ds.astype(q.dtype), q, preferred_element_type=_F32
            )
            return dk, dv

        def body(i: jax.Array, carry: Any) -> Any:
            return blocks.skip(b, i, j, functools.partial(step, i), carry)

        zeros = blocks.fill((heads, cfg.block_kv, dim))
        dk, dv = lax.fori_loop(0, n_q, body, (zeros, zeros))
        return dk.astype(x.k.dtype), dv.astype(x.v.dtype)

    dq = lax.map(dq_block, jnp.arange(batch * n_q))
    dq = dq.reshape(batch, n_q, heads, group, cfg.block_q, dim)
    dk, dv = lax.map(dkv_block, jnp.arange(batch * n_kv))
    kv_blocks = (batch, n_kv, heads, cfg.block_kv, dim)
    return (
        jnp.moveaxis(dq, 1, 3).reshape(x.q.shape),
        jnp.moveaxis(dk.reshape(kv_blocks), 1, 2).reshape(x.k.shape),
        jnp.moveaxis(dv.reshape(kv_blocks), 1, 2).reshape(x.v.shape),
    )


def blockwise_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_ids: jax.Array,
    kv_ids: jax.Array,
    q_pos: jax.Array,
    kv_pos: jax.Array,
    cfg: _Config,
) -> jax.Array:
    """Attention inside each document, blockwise, in the kernel's layout (the module
    docstring), with its own gradient (no gradient for ids and positions)."""
    return _blockwise(q, k, v, q_ids, kv_ids, q_pos, kv_pos, cfg)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _blockwise(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_ids: jax.Array,
    kv_ids: jax.Array,
    q_pos: jax.Array,
    kv_pos: jax.Array,
    cfg: _Config,
) -> jax.Array:
    return _forward_pass(_Inputs(q, k, v, q_ids, kv_ids, q_pos, kv_pos), cfg)[0]


def _forward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_ids: jax.Array,
    kv_ids: jax.Array,
    q_pos: jax.Array,
    kv_pos: jax.Array,
    cfg: _Config,
) -> tuple[jax.Array, Any]:
    x = _Inputs(q, k, v, q_ids, kv_ids, q_pos, kv_pos)
    out, lse = _forward_pass(x, cfg)
    return out, (x, out, lse)  # O(T): the inputs, the output, the log-sum-exp


def _backward(cfg: _Config, residuals: Any, d_out: jax.Array) -> tuple[Any, ...]:
    x, out, lse = residuals
    return (*_backward_pass(x, cfg, out, lse, d_out), None, None, None, None)


_blockwise.defvjp(_forward, _backward)


def make_config(scale: float, causal: bool, block_q: int, block_kv: int) -> _Config:
    """The kernel's static settings (hashable: one compilation per setting)."""
    return _Config(float(scale), bool(causal), int(block_q), int(block_kv))
