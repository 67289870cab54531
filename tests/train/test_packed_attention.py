"""packed_attention: each document's attention alone, in the row's order and under every
context layout over a data x context mesh; splash attention agrees; memory linear in
the row; every bad argument refused by name."""

from __future__ import annotations

import functools
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import meshfeed
from attention_fns import ROWS, SEQ_LEN, packed_rows, qkv_and_weights, reference
from meshfeed.core._context_layout import ContextKind, order
from meshfeed.train import packed_attention, restore_order
from meshfeed.train._packed_attention_kernel import live_pairs

CONTEXT = meshfeed.CONTEXT
LAYOUTS: tuple[tuple[ContextKind, int], ...] = (("dual_chunk", 1), ("striped", 1), ("striped", 2))
BLOCK = 32  # several blocks a device, some skipped
attend_by_blocks = functools.partial(packed_attention, block_q=BLOCK, block_kv=BLOCK)


def _close(got, want, atol: float = 1e-5, err_msg: str = "") -> None:
    np.testing.assert_allclose(
        np.asarray(got), np.asarray(want), atol=atol, rtol=1e-5, err_msg=err_msg
    )


@pytest.fixture(scope="module")
def rows() -> dict[str, np.ndarray]:
    return packed_rows()


@pytest.fixture(scope="module")
def case(rows):
    """q, k, v (2 query heads over 1 key/value head), the loss's weights, and the
    reference's output and gradients in the row's order."""
    q, k, v, w = qkv_and_weights(0, heads=2, kv_heads=1, dim=16)
    out, grads = reference(q, k, v, rows["segment_ids"], d_out=w)
    return (q, k, v, w), out, grads


def _check(got_out, got_grads, want_out, want_grads) -> None:
    _close(got_out, want_out)
    for name, got, want in zip("qkv", got_grads, want_grads, strict=True):
        _close(got, want, err_msg=f"d{name}")


def _forward_and_grads(attend):
    """jit of ``(q, k, v, ids, pos, w) -> ((loss, out), (dq, dk, dv))``, loss ``sum(out * w)``."""

    def run(q, k, v, ids, pos, w):
        def loss(q, k, v):
            out = attend(q, k, v, ids, pos)
            return jnp.sum(out * w), out

        return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)

    return jax.jit(run)


def _reorder(x, index: np.ndarray) -> np.ndarray:
    """``x[b, index[b]]`` for each row ``b`` (``x``: ``[rows, T, ...]``)."""
    x = np.asarray(x)
    return np.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def test_rows_in_any_order_match_each_document_alone(rows, case):
    (q, k, v, w), want_out, want_grads = case
    ids, pos = rows["segment_ids"], rows["positions"]
    assert (ids == 0).any() and (ids.max(axis=1) == 1).any() and ids.max() > 5
    run = _forward_and_grads(
        lambda q, k, v, ids, pos: attend_by_blocks(q, k, v, ids, positions=pos)
    )
    (_, out), grads = run(q, k, v, ids, pos, w)
    _check(out, grads, want_out, want_grads)
    # padding attends nothing and is attended by nothing: output and gradients exactly 0
    pad = ids == 0
    assert not np.asarray(out)[pad].any()
    assert not any(np.asarray(g)[pad].any() for g in grads)
    # tokens in any order (each row its own): right, since blocks are skipped only when
    # ids and positions say they hold nothing
    shuffled = np.argsort(np.random.default_rng(0).random(ids.shape), axis=1)
    (_, out), grads = run(*(_reorder(x, shuffled) for x in (q, k, v, ids, pos, w)))
    back = np.argsort(shuffled, axis=1)
    _check(_reorder(out, back), [_reorder(g, back) for g in grads], want_out, want_grads)
    # in the row's own order, the array index is the document's order
    _close(jax.jit(attend_by_blocks)(q, k, v, ids), want_out)


@pytest.mark.parametrize("cp", [2, 4])
def test_every_context_layout_matches_each_document_alone(rows, case, cp):
    (q, k, v, w), want_out, want_grads = case
    mesh = meshfeed.make_mesh(data=8 // cp, context=cp)
    spec = P(meshfeed.DATA, CONTEXT)

    def local(q, k, v, ids, pos):
        return attend_by_blocks(q, k, v, ids, positions=pos, context_axis=CONTEXT)

    attend = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 5, out_specs=spec)
    run = _forward_and_grads(attend)  # compiled once for every layout of this cp
    for kind, stripe in LAYOUTS:
        laid = order(SEQ_LEN, cp, kind, stripe)
        args = [x[:, laid] for x in (q, k, v, rows["segment_ids"], rows["positions"], w)]
        (_, out), grads = run(*args)
        back = functools.partial(restore_order, cp=cp, kind=kind, stripe=stripe)
        _check(back(out), [back(g) for g in grads], want_out, want_grads)


@pytest.mark.parametrize(
    ("cp", "kind", "stripe"), [(1, "dual_chunk", 1), *((2, *x) for x in LAYOUTS)]
)
def test_skipped_block_pairs_hold_no_allowed_pair(rows, cp, kind, stripe):
    """And in the row's order and the dual chunk layout (blocks inside chunks), every
    pair computed holds one: the skip test is exact there."""
    laid = order(SEQ_LEN, cp, kind, stripe)
    ids, pos = rows["segment_ids"][:, laid], rows["positions"][:, laid]
    for causal in (True, False):
        computed = np.asarray(live_pairs(ids, ids, pos, pos, BLOCK, BLOCK, causal))
        allowed = (ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] > 0)
        if causal:
            allowed &= pos[:, :, None] >= pos[:, None, :]
        n = SEQ_LEN // BLOCK
        held = allowed.reshape(ROWS, n, BLOCK, n, BLOCK).any(axis=(2, 4))
        assert not (held & ~computed).any()
        if kind == "dual_chunk":
            np.testing.assert_array_equal(computed, held)
        assert held.sum() < held.size  # something to skip


def test_keys_of_their_own_length_blocks_that_do_not_divide_and_grouped_heads(rows):
    ids, pos = rows["segment_ids"], rows["positions"]
    q, k, v, _ = qkv_and_weights(1, heads=4, kv_heads=2, dim=8)
    tail = slice(SEQ_LEN - 64, SEQ_LEN)  # the last 64 queries against the whole row
    keys = {"kv_segment_ids": ids, "kv_positions": pos}
    got = packed_attention(
        q[:, tail], k, v, ids[:, tail], positions=pos[:, tail], block_q=48, block_kv=40, **keys
    )
    _close(got, reference(q, k, v, ids)[:, tail])
    none = packed_attention(q[:, :0], k, v, ids[:, :0], kv_segment_ids=ids)  # no queries
    assert none.shape == (ROWS, 0, 4, 8)


def test_without_causality_and_in_bfloat16(rows):
    ids = rows["segment_ids"]
    q, k, v, _ = qkv_and_weights(2, heads=2, kv_heads=2, dim=16)
    _close(attend_by_blocks(q, k, v, ids, causal=False), reference(q, k, v, ids, causal=False))
    q16, k16, v16 = (x.astype(jnp.bfloat16) for x in (q, k, v))
    low = attend_by_blocks(q16, k16, v16, ids)  # float32 inside, bfloat16 out
    assert low.dtype == jnp.bfloat16
    _close(low.astype(jnp.float32), reference(q, k, v, ids), atol=0.05)


def test_splash_attention_agrees_on_the_tokens_of_documents(rows):
    """Splash (Pallas, interpret mode) on our segment ids: equal on every real token
    (splash lets padding attend padding; we output 0 there)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    ids = rows["segment_ids"][:2]
    q, k, v, _ = qkv_and_weights(3, heads=2, kv_heads=2, dim=16, rows=2)
    mask = splash.MultiHeadMask([splash.CausalMask((SEQ_LEN, SEQ_LEN))] * 2)
    kernel = splash.make_splash_mha_single_device(
        mask, block_sizes=splash.BlockSizes.get_default(), interpret=True
    )

    def one_row(q, k, v, ids):  # [T, N, H] as splash takes them, [N, T, H]
        q, k, v = (jnp.swapaxes(x, 0, 1) for x in (q, k, v))
        out = kernel(q / 4.0, k, v, splash.SegmentIds(ids, ids))  # splash does not scale
        return jnp.swapaxes(cast(jax.Array, out), 0, 1)

    got = jax.jit(jax.vmap(one_row))(q, k, v, jnp.asarray(ids))
    real = ids > 0
    assert (~real).any()
    _close(np.asarray(got)[real], reference(q, k, v, ids)[real])


def _temporaries(f, length: int) -> int:
    floats = jax.ShapeDtypeStruct((1, length, 2, 16), jnp.float32)
    ints = jax.ShapeDtypeStruct((1, length), jnp.int32)

    def loss(q, k, v, ids):
        return jnp.sum(f(q, k, v, ids) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    stats = grad.lower(floats, floats, floats, ints).compile().memory_analysis()
    assert stats is not None
    return stats.temp_size_in_bytes


def test_memory_of_forward_and_gradient_is_linear_in_the_row():
    def dense(q, k, v, ids):
        return jax.nn.dot_product_attention(q, k, v, mask=meshfeed.segment_mask(ids)[:, None])

    ours = [_temporaries(packed_attention, n) for n in (2048, 4096)]
    theirs = [_temporaries(dense, n) for n in (2048, 4096)]
    assert ours[1] / ours[0] <= 2.2, ours
    assert theirs[1] / theirs[0] >= 3.5, theirs  # the dense path: quadratic
    assert ours[1] < theirs[1] / 10


_Q = np.zeros((2, 8, 4, 16), np.float32)
_KV = np.zeros((2, 8, 2, 16), np.float32)
_IDS = np.ones((2, 8), np.int32)
_BAD = [
    ((_Q[0], _KV, _KV, _IDS), {}, ValueError, r"q has shape \(8, 4, 16\); .*\[batch, tokens"),
    ((_Q.astype(np.int32), _KV, _KV, _IDS), {}, TypeError, "q has dtype int32; pass floats"),
    ((_Q, _KV, _KV[:, :4], _IDS), {}, ValueError, "k has shape .* and v .*; pass keys and"),
    ((_Q, _KV[:1], _KV[:1], _IDS), {}, ValueError, r"batch \(axis 0\) and head_dim"),
    ((_Q[:, :, :3], _KV, _KV, _IDS), {}, ValueError, "3 heads do not split into groups over"),
    ((_Q, _KV, _KV, _IDS[:, :4]), {}, ValueError, r"segment_ids has shape \(2, 4\); pass"),
    ((_Q, _KV, _KV, _IDS.astype(np.float32)), {}, TypeError, "segment_ids has dtype float32"),
    ((_Q, _KV, _KV, _IDS), {"positions": _IDS[:1]}, ValueError, "positions has shape"),
    ((_Q, _KV, _KV, _IDS), {"kv_positions": _IDS}, ValueError, "kv_positions without positions"),
    ((_Q, _KV[:, :4], _KV[:, :4], _IDS), {}, ValueError, "keys of 4 tokens and queries of 8: pass"),
    ((_Q, _KV, _KV, _IDS), {"kv_segment_ids": _IDS[:, :4]}, ValueError, "kv_segment_ids has"),
    ((_Q, _KV, _KV, _IDS), {"block_q": 0}, ValueError, "block_q=0 must be a positive int"),
    ((_Q, _KV, _KV, _IDS), {"block_kv": 16.0}, ValueError, "block_kv=16.0 must be a positive"),
    ((_Q, _KV, _KV, _IDS), {"scale": -1.0}, ValueError, r"scale=-1.0 .* None for 1/sqrt\(16\)"),
    (
        (_Q, _KV, _KV, _IDS),
        {"context_axis": CONTEXT},
        ValueError,
        "context_axis='context' is not a mesh axis of an enclosing jax.shard_map",
    ),
]


@pytest.mark.parametrize(("args", "kwargs", "error", "match"), _BAD)
def test_bad_arguments_are_refused_by_name(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        packed_attention(*args, **kwargs)


def test_causal_attention_over_a_context_axis_needs_positions():
    mesh = meshfeed.make_mesh(data=4, context=2)
    spec = P(meshfeed.DATA, CONTEXT)
    local = functools.partial(packed_attention, context_axis=CONTEXT)
    attend = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=spec)
    q = jax.ShapeDtypeStruct((ROWS, 16, 2, 8), jnp.float32)
    ids = jax.ShapeDtypeStruct((ROWS, 16), jnp.int32)
    with pytest.raises(
        ValueError, match="context_axis='context' with causal=True needs positions="
    ):
        jax.eval_shape(attend, q, q, q, ids)
