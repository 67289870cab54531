"""Packed rows of long-tail documents, and attention computed one document at a time:
the reference ``packed_attention`` is checked against."""

from __future__ import annotations

from typing import Any

import numpy as np
from jax.typing import ArrayLike

import meshfeed

SEQ_LEN = 256
ROWS = 4


def packed_rows(seq_len: int = SEQ_LEN) -> dict[str, np.ndarray]:
    """``ROWS`` rows of ``meshfeed.pack`` over documents of 1 to ~2.5 ``seq_len`` tokens
    (a long tail: most short, two exactly ``seq_len``, some split): the row with the
    most documents, one whole document of ``seq_len``, the row with the most padding and
    the row with the second most documents."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(np.ceil(rng.pareto(1.2, 40) * 20).astype(int) + 1, 600)
    lengths[[3, 11]] = seq_len
    docs = [np.full(n, i, np.int32) for i, n in enumerate(lengths)]
    source = meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(docs, dtype=np.int32)})
    packed = meshfeed.pack(source, seq_len, long_docs="split")
    assert packed.stats()["split_documents"] > 0
    rows = packed[np.arange(len(packed))]
    ids, tokens = rows["segment_ids"], rows["tokens"]
    counts = ids.max(axis=1)
    by_count = np.argsort(-counts, kind="stable")
    whole = [r for r in range(len(ids)) if counts[r] == 1 and (ids[r] > 0).all()
             and lengths[tokens[r, 0]] == seq_len]  # fmt: skip
    padded = int(np.argmax((ids == 0).sum(axis=1)))
    pick = [int(by_count[0]), whole[0], padded, int(by_count[1])]
    assert len(set(pick)) == ROWS
    return {"segment_ids": ids[pick], "positions": rows["positions"][pick]}


def qkv_and_weights(
    seed: int, heads: int, kv_heads: int, dim: int, rows: int = ROWS, seq_len: int = SEQ_LEN
) -> tuple[np.ndarray, ...]:
    """q ``[rows, seq_len, heads, dim]``, k and v with ``kv_heads``, and the weights of
    the scalar loss ``sum(out * w)``: float32 normals (numpy's: jax.random's first calls
    compile for seconds)."""
    rng = np.random.default_rng(seed)
    return tuple(
        rng.standard_normal((rows, seq_len, n, dim), dtype=np.float32)
        for n in (heads, kv_heads, kv_heads, heads)
    )


def reference(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    segment_ids: np.ndarray,
    d_out: ArrayLike | None = None,
    causal: bool = True,
) -> Any:
    """Each document's attention alone (its tokens in the row's order, a plain softmax),
    in float64 numpy, written back in place (padding 0). With ``d_out``, also the
    gradients in q, k, v of ``sum(out * d_out)``: ``(out, (dq, dk, dv))``."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    out, dq, dk, dv = (np.zeros(q.shape) for _ in range(4))
    scale = 1 / np.sqrt(q.shape[-1])
    for b, row in enumerate(np.asarray(segment_ids)):
        for doc in np.unique(row[row > 0]):
            at = np.flatnonzero(row == doc)
            qd, kd, vd = q[b, at].swapaxes(0, 1), k[b, at].swapaxes(0, 1), v[b, at].swapaxes(0, 1)
            scores = qd @ kd.swapaxes(1, 2) * scale  # [heads, L, L]
            if causal:
                scores = np.where(np.tril(np.ones(scores.shape[1:], bool)), scores, -np.inf)
            p = np.exp(scores - scores.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            out[b, at] = (p @ vd).swapaxes(0, 1)
            if d_out is None:
                continue
            do = np.asarray(d_out, np.float64)[b, at].swapaxes(0, 1)
            dp = do @ vd.swapaxes(1, 2)
            ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
            dq[b, at] = (ds @ kd).swapaxes(0, 1)
            dk[b, at] = (ds.swapaxes(1, 2) @ qd).swapaxes(0, 1)
            dv[b, at] = (p.swapaxes(1, 2) @ do).swapaxes(0, 1)
    if d_out is None:
        return out

    def grouped(x: np.ndarray) -> np.ndarray:  # the query heads' sum per key/value head
        return x.reshape(*x.shape[:2], -1, group, x.shape[-1]).sum(axis=3)

    return out, (dq, grouped(dk), grouped(dv))
