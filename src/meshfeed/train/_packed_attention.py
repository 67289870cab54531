"""Attention inside each document of a packed row, without a dense mask:
``packed_attention``.

``segment_mask`` builds the ``[T, T]`` mask of a packed row, and attention through it
holds ``[batch, heads, T, T]`` scores: at 32k tokens and 4 heads, 16 GiB of float32 for
the scores alone, and the gradient holds several of them. ``packed_attention`` never
holds more than one pair of blocks of scores. Its forward pass runs over blocks of
queries, and for each over the blocks of keys with an online softmax (a running
maximum, sum and output, rescaled as a larger maximum turns up); it keeps the output and
the log-sum-exp of each query, ``O(T)``. Its gradient is a ``jax.custom_vjp`` in the
manner of FlashAttention-2 (Levanter's pure-JAX version is the closest model): one pass
over query blocks gives ``dq``, one over key blocks gives ``dk, dv``, both recomputing the
probabilities block by block from the log-sum-exp, so the backward pass is linear too.
(Differentiating through the loops instead -- tokamax's ``xla_chunked`` relies on remat
-- saves the running output for every key block: quadratic again.) Measured by
``benchmarks/attention.py`` from XLA's compiled memory analysis (CPU, one row, 4 heads of
64, float32): the forward pass and gradient peak at 4.7 times the bytes of q, k and v at
8k tokens and at 32k alike (449 MiB at 32k, where the dense path compiles to 48 GiB and
grows 4x per doubling).

Which token sees which is the document's own order, never the array's: query ``i``
attends key ``j`` iff they carry the same non-zero segment id and, causal, ``positions[i]
>= positions[j]``. That is what keeps it right under a context layout, where a device's
slice of a row is not a contiguous piece of it; and padding (id 0) attends nothing and
outputs 0, as Transformer Engine does (splash attention and Pallas' GPU kernel let
padding attend padding; the outputs of real tokens agree). Pairs of blocks with no
allowed pair -- the future of a causal row, other documents of a packed one -- are
skipped (``_packed_attention_kernel`` says how it tells), which is what makes packed and
causal rows cheap: at 8k tokens the forward pass and gradient took 0.12 of the dense
path's time on a packed row of 14 documents, and 0.38 on a causal row of one document
(same benchmark).

Over a context mesh axis (``context_axis=``, inside ``jax.shard_map``), each device
holds its slice of the laid-out row -- queries, ids and positions -- and gathers the keys
and values of the whole row (``all_gather``, whose gradient JAX makes a reduce-scatter),
then attends locally: the all-gather scheme of MaxText's and Transformer Engine's
context parallelism, with keys in the gathered (laid-out) order, which needs no
reordering since causality is by positions.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from meshfeed.train._packed_attention_kernel import blockwise_attention, make_config

BLOCK = 256
"""Default block of queries and of keys. On CPU, at 8k tokens (a packed row, forward pass
and gradient), blocks of 256 ran 1.1x faster than 128, 1.9x faster than 512 and 3.1x
faster than 1024 (``benchmarks/attention.py``): a larger block holds more pairs that no
document links, and smaller ones cost more loop steps. A block's scores take 256 KiB a
head in float32."""


def packed_attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    segment_ids: ArrayLike,
    *,
    positions: ArrayLike | None = None,
    causal: bool = True,
    kv_segment_ids: ArrayLike | None = None,
    kv_positions: ArrayLike | None = None,
    scale: float | None = None,
    block_q: int = BLOCK,
    block_kv: int = BLOCK,
    context_axis: str | None = None,
) -> jax.Array:
    """Attention inside each document of packed rows, with memory linear in the row.

    Query ``i`` attends key ``j`` iff both carry the same non-zero segment id and, with
    ``causal``, ``positions[i] >= positions[j]``. Padding queries (id 0) attend nothing:
    their output and gradient are 0. Scores and the softmax are float32 whatever the
    inputs' dtype; the output has ``q``'s dtype. Rows whose length is not a multiple of
    the block are padded inside (with id 0, so nothing changes but the work).

    Args:
      q: queries ``[batch, T, N, H]`` (``jax.nn.dot_product_attention``'s layout).
      k, v: keys and values ``[batch, S, K, H]``, ``N`` a multiple of ``K`` (grouped
        queries: query head ``n`` reads key/value head ``n // (N // K)``).
      segment_ids: ``[batch, T]`` integers, documents 1, 2, ... and 0 for padding, as
        ``meshfeed.pack`` gives them.
      positions: ``[batch, T]`` integers, each token's place in its document (0 at its
        start), as ``meshfeed.pack`` gives them. Default: the array index, which is right
        only for rows in their own order (no context layout).
      causal: a token attends only to tokens at or before its position.
      kv_segment_ids, kv_positions: the keys', ``[batch, S]``; default ``segment_ids``
        and ``positions`` (then ``S`` must equal ``T``).
      scale: the scores' factor; default ``1 / sqrt(H)``.
      block_q, block_kv: queries and keys per block (at most the row's length).
      context_axis: the mesh axis the rows are split over, when called inside
        ``jax.shard_map``: every argument is then this device's slice of the laid-out
        rows, and the keys, values and their ids and positions are gathered over the
        axis. Causal attention then needs ``positions``.

    Returns:
      ``[batch, T, N, H]`` in ``q``'s dtype.

    Raises:
      ValueError: shapes that do not fit together (keys of another length need their
        own ``kv_segment_ids``), ``kv_positions`` without ``positions``, a block that
        is not a positive int, a scale that is not a positive number, ``context_axis``
        outside a ``shard_map`` over it, or causal attention over a context axis
        without ``positions``.
      TypeError: ids or positions that are not integers, inputs that are not floats.

    Example:
      >>> batch = next(loader)  # rows from meshfeed.pack  # doctest: +SKIP
      >>> out = meshfeed.train.packed_attention(  # doctest: +SKIP
      ...     q, k, v, batch["segment_ids"], positions=batch["positions"]
      ... )

      Over a ``data x context`` mesh, rows laid out by a context layout::

        def attend(q, k, v, ids, pos):
            return packed_attention(q, k, v, ids, positions=pos, context_axis="context")

        rows = P("data", "context")
        out = jax.shard_map(attend, mesh=mesh, in_specs=(rows,) * 5, out_specs=rows)(
            q, k, v, batch["segment_ids"], batch["positions"]
        )
    """
    shapes = [jax.typeof(x) for x in (q, k, v)]  # checked before any array is made
    _check_inputs(*shapes)
    batch, length, _, dim = shapes[0].shape
    kv_length = shapes[1].shape[1]
    for name, x, size in (
        ("segment_ids", segment_ids, length),
        ("positions", positions, length),
        ("kv_segment_ids", kv_segment_ids, kv_length),
        ("kv_positions", kv_positions, kv_length),
    ):
        _check_tokens(name, x, (batch, size))
    if positions is None and kv_positions is not None and causal:
        raise ValueError(
            "kv_positions without positions: causal attention compares the two; pass "
            "positions= too (the queries' places in their documents)."
        )
    _check_block("block_q", block_q)
    _check_block("block_kv", block_kv)
    scale = _check_scale(scale, dim)
    if context_axis is not None:
        _check_context(context_axis, positions, causal)
    elif kv_length != length and (
        kv_segment_ids is None or (kv_positions is None and positions is not None)
    ):
        raise ValueError(
            f"keys of {kv_length} tokens and queries of {length}: pass kv_segment_ids= "
            f"(and kv_positions=, with positions=) for the keys, [batch, {kv_length}]."
        )
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    q_ids = jnp.asarray(segment_ids)
    kv_ids = q_ids if kv_segment_ids is None else jnp.asarray(kv_segment_ids)
    q_pos = None if positions is None else jnp.asarray(positions)
    kv_pos = q_pos if kv_positions is None else jnp.asarray(kv_positions)
    if context_axis is not None:
        k, v = _gather(k, context_axis), _gather(v, context_axis)
        kv_ids = _gather(kv_ids, context_axis)
        kv_pos = None if kv_pos is None else _gather(kv_pos, context_axis)
        kv_length = k.shape[1]
    if q_pos is None or kv_pos is None:  # the array index (unless not causal: unused)
        q_pos = jnp.broadcast_to(jnp.arange(length), (batch, length))
        kv_pos = jnp.broadcast_to(jnp.arange(kv_length), (batch, kv_length))
    return _attend(q, k, v, (q_ids, kv_ids, q_pos, kv_pos), scale, causal, block_q, block_kv)


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7))
def _attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    tokens: tuple[jax.Array, ...],
    scale: float,
    causal: bool,
    block_q: int,
    block_kv: int,
) -> jax.Array:
    """Pads to whole blocks, moves to the kernel's layout and back. Jitted: called
    eagerly, the kernel's loops compile once, not one primitive at a time."""
    batch, length, heads, dim = q.shape
    kv_heads, kv_length = k.shape[2], k.shape[1]
    if not length or not kv_length:  # nothing to attend
        return jnp.zeros(q.shape, q.dtype)
    block_q, block_kv = min(block_q, length), min(block_kv, kv_length)
    q_pad, kv_pad = -length % block_q, -kv_length % block_kv
    q_ids, kv_ids, q_pos, kv_pos = (x.astype(jnp.int32) for x in tokens)

    def pad(x: jax.Array, extra: int) -> jax.Array:
        return jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2)) if extra else x

    group = heads // kv_heads
    q_k = pad(q, q_pad).reshape(batch, length + q_pad, kv_heads, group, dim)
    out = blockwise_attention(
        q_k.transpose(0, 2, 3, 1, 4),
        pad(k, kv_pad).transpose(0, 2, 1, 3),
        pad(v, kv_pad).transpose(0, 2, 1, 3),
        pad(q_ids, q_pad),
        pad(kv_ids, kv_pad),
        pad(q_pos, q_pad),
        pad(kv_pos, kv_pad),
        make_config(scale, causal, block_q, block_kv),
    )
    out = out.transpose(0, 3, 1, 2, 4).reshape(batch, length + q_pad, heads, dim)
    return out[:, :length]


def _gather(x: jax.Array, axis: str) -> jax.Array:
    """The whole laid-out row of ``x`` from each device's slice along axis 1."""
    return lax.all_gather(x, axis, axis=1, tiled=True)


def _check_inputs(q: Any, k: Any, v: Any) -> None:
    """Shapes and dtypes of q, k, v (``jax.typeof``'s)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(
                f"{name} has shape {x.shape}; packed_attention takes [batch, tokens, heads, "
                "head_dim] (jax.nn.dot_product_attention's layout): add the missing axes."
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} has dtype {x.dtype}; pass floats (float32, bfloat16, ...).")
    if k.shape != v.shape:
        raise ValueError(f"k has shape {k.shape} and v {v.shape}; pass keys and values alike.")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"q has shape {q.shape} and k {k.shape}: batch (axis 0) and head_dim (axis 3) "
            "must agree."
        )
    if q.shape[2] % k.shape[2]:
        raise ValueError(
            f"q's {q.shape[2]} heads do not split into groups over k's {k.shape[2]}; pass a "
            "number of query heads that is a multiple of the key/value heads."
        )


def _check_tokens(name: str, x: ArrayLike | None, shape: tuple[int, int]) -> None:
    if x is None:
        return
    spec = jax.typeof(x)
    if spec.shape != shape:
        raise ValueError(f"{name} has shape {spec.shape}; pass [batch, tokens] = {list(shape)}.")
    if not jnp.issubdtype(spec.dtype, jnp.integer):
        raise TypeError(f"{name} has dtype {spec.dtype}; pass integers, as meshfeed.pack gives.")


def _check_block(name: str, block: object) -> None:
    if isinstance(block, bool) or not isinstance(block, numbers.Integral) or block < 1:
        raise ValueError(f"{name}={block!r} must be a positive int (tokens per block).")


def _check_scale(scale: object, dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not float(scale) > 0:
        raise ValueError(
            f"scale={scale!r} must be a positive number; leave it None for 1/sqrt({dim})."
        )
    return float(scale)


def _check_context(axis: str, positions: ArrayLike | None, causal: bool) -> None:
    try:
        lax.axis_size(axis)
    except NameError:
        raise ValueError(
            f"context_axis={axis!r} is not a mesh axis of an enclosing jax.shard_map; call "
            f"packed_attention inside jax.shard_map(..., mesh=mesh) over a mesh with axis "
            f"{axis!r}, or leave context_axis=None for rows held whole."
        ) from None
    if causal and positions is None:
        raise ValueError(
            f"context_axis={axis!r} with causal=True needs positions=: a context layout "
            "puts tokens out of the row's order, so the array index is not their order; "
            "pass the laid-out batch['positions']."
        )
