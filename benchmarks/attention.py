"""Attention without a dense mask: packed_attention's memory and time, against the dense path.

``meshfeed.train.packed_attention`` against ``segment_mask`` and a softmax.

One attention call on CPU, batch 1, 4 heads of 64, float32, on a row of ``T`` tokens:

- **memory**: XLA's compiled ``memory_analysis()`` (temporaries + arguments + outputs)
  of the forward pass and of the forward and backward pass (the gradient of a scalar
  loss with respect to q, k, v), at T = 2k, 8k and 32k, for ``packed_attention`` and for
  the dense path (``segment_mask`` + ``jax.nn.dot_product_attention(mask=...)``). Only
  compiled, never run, so the dense path's 32k entry (whose scores alone are 16 GiB) is
  its compiled figure. Each entry also gives its bytes over those of q, k and v, and the
  last entries the per-doubling growth of that overhead from 8k to 32k (goal <= 1.1:
  what a call holds beyond its inputs stays flat).
- **time**: seconds per call at equal T (2k and 8k; the dense path's 32k does not fit in
  this machine's memory), both paths on the same packed row (documents of log-normal
  lengths, median ~400 tokens, from ``meshfeed.pack``) and on a row of one document:
  rotating rounds, each path timed over a window of >= 0.3 s, the median of the
  per-round ratios (``packed_over_dense``). ``packed_attention`` alone at 32k.
- **blocks**: ``packed_attention``'s forward and backward at 8k for blocks of 128 to
  1024 tokens (the default's reason).

Prints one JSON line per measurement; ``--smoke``: T = 512 and 1024, forward and
backward only, one round (~15 s here, nearly all of it compiling).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import meshfeed

HEADS, DIM = 4, 64
MB = 2**20


def packed_row(length: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids and positions ``[1, length]`` of a row of ``meshfeed.pack``: documents
    of log-normal lengths (median ~400 tokens), long ones split."""
    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(6.0, 1.1, 4 * length // 400 + 8), 1, None).astype(np.int64)
    docs = [np.zeros(n, np.int32) for n in sizes]
    source = meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(docs, dtype=np.int32)})
    row = meshfeed.pack(source, length, long_docs="split")[np.array([0])]
    return row["segment_ids"], row["positions"]


def one_document(length: int) -> tuple[np.ndarray, np.ndarray]:
    return np.ones((1, length), np.int32), np.arange(length, dtype=np.int32)[None]


def attention(path: str, grad: bool, block: int | None = None) -> Callable[..., Any]:
    """``f(q, k, v, segment_ids, positions, w)`` of one path: the output (``w`` unused),
    or the gradient of ``sum(out * w)`` in q, k, v."""
    attend = meshfeed.train.packed_attention
    if block is not None:
        attend = functools.partial(attend, block_q=block, block_kv=block)

    def f(q: jax.Array, k: jax.Array, v: jax.Array, ids: jax.Array, pos: jax.Array) -> jax.Array:
        if path == "dense":
            mask = meshfeed.segment_mask(ids)[:, None]
            return jax.nn.dot_product_attention(q, k, v, mask=mask)
        return attend(q, k, v, ids, positions=pos)

    def loss(*args: jax.Array) -> jax.Array:
        return jnp.sum(f(*args[:5]) * args[5])

    return jax.grad(loss, argnums=(0, 1, 2)) if grad else lambda *args: f(*args[:5])


def compiled(path: str, grad: bool, length: int, block: int | None = None) -> Any:
    """The call compiled for ``[1, length]`` rows (compiled only: nothing is allocated)."""
    floats = jax.ShapeDtypeStruct((1, length, HEADS, DIM), jnp.float32)
    ints = jax.ShapeDtypeStruct((1, length), jnp.int32)
    args = (floats, floats, floats, ints, ints, floats)
    return jax.jit(attention(path, grad, block)).lower(*args).compile()


def arrays(length: int) -> tuple[jax.Array, ...]:
    """q, k, v and the loss's weights ``w``."""
    keys = jax.random.split(jax.random.key(0), 4)
    return tuple(jax.random.normal(key, (1, length, HEADS, DIM)) for key in keys)


def memory_line(path: str, grad: bool, length: int, call: Any, smoke: bool) -> float:
    """Prints the call's memory; returns its peak over the bytes of q, k and v."""
    stats = call.memory_analysis()
    qkv = 3 * length * HEADS * DIM * 4
    peak = (
        stats.temp_size_in_bytes
        + stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
    )
    print(
        json.dumps(
            {
                "benchmark": "attention",
                "part": "memory",
                "path": path,
                "passes": _passes(grad),
                "tokens": length,
                "heads": HEADS,
                "head_dim": DIM,
                "qkv_mb": round(qkv / MB, 2),
                "temporaries_mb": round(stats.temp_size_in_bytes / MB, 2),
                "arguments_mb": round(stats.argument_size_in_bytes / MB, 2),
                "outputs_mb": round(stats.output_size_in_bytes / MB, 2),
                "peak_mb": round(peak / MB, 2),
                "peak_over_qkv": round(peak / qkv, 3),
                "smoke": smoke,
            }
        ),
        flush=True,
    )
    return peak / qkv


def growth_line(
    path: str, grad: bool, low: int, high: int, over: dict[int, float], smoke: bool
) -> None:
    per_doubling = (over[high] / over[low]) ** (1 / np.log2(high / low))
    print(
        json.dumps(
            {
                "benchmark": "attention",
                "part": "memory_growth",
                "path": path,
                "passes": _passes(grad),
                "from_tokens": low,
                "to_tokens": high,
                "peak_over_qkv_per_doubling": round(per_doubling, 3),
                "peak_per_doubling": round(2 * per_doubling, 3),
                "smoke": smoke,
            }
        ),
        flush=True,
    )


def _passes(grad: bool) -> str:
    return "forward_backward" if grad else "forward"


def _seconds_per_call(run: Callable[[], Any], window: float) -> float:
    calls, start = 0, time.perf_counter()
    while True:
        jax.block_until_ready(run())
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= window:
            return elapsed / calls


def rounds_of(
    calls: dict[Any, Callable[[], Any]], rounds: int, window: float
) -> dict[Any, list[float]]:
    """Seconds per call of each entry, per round, in rotating order."""
    names = list(calls)
    got: dict[Any, list[float]] = {name: [] for name in names}
    for name in names:
        jax.block_until_ready(calls[name]())  # warm
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            got[name].append(_seconds_per_call(calls[name], window))
    return got


def timing(
    length: int, grad: bool, calls: dict[str, Any], rounds: int, window: float, smoke: bool
) -> None:
    """Seconds per call of each compiled path on a packed row and on one document."""
    q, k, v, w = arrays(length)
    for row, (ids, pos) in (
        ("packed_row", packed_row(length)),
        ("one_document", one_document(length)),
    ):
        args = (q, k, v, jnp.asarray(ids), jnp.asarray(pos), w)
        got = rounds_of({p: functools.partial(c, *args) for p, c in calls.items()}, rounds, window)
        line: dict[str, Any] = {
            "benchmark": "attention",
            "part": "time",
            "row": row,
            "tokens": length,
            "documents": int(ids.max()),
            "passes": _passes(grad),
            "rounds": rounds,
            "smoke": smoke,
        }
        for path, seconds in got.items():
            line[f"{path}_s"] = round(statistics.median(seconds), 4)
        if "dense" in got:
            ratios = [a / b for a, b in zip(got["packed"], got["dense"], strict=True)]
            line["packed_over_dense"] = round(statistics.median(ratios), 3)
        print(json.dumps(line), flush=True)


def run(
    lengths: list[int],
    timed: list[int],
    dense_timed: list[int],
    passes: list[bool],
    rounds: int,
    window: float,
    smoke: bool,
) -> None:
    """Memory at every length, and time at the ``timed`` ones (against the dense path at
    ``dense_timed``), each call compiled once for both."""
    for grad in passes:
        over: dict[str, dict[int, float]] = {"packed": {}, "dense": {}}
        for length in lengths:
            calls = {}
            for path in ("packed", "dense"):
                call = compiled(path, grad, length)
                over[path][length] = memory_line(path, grad, length, call, smoke)
                if length in timed and (path == "packed" or length in dense_timed):
                    calls[path] = call
            if calls:
                timing(length, grad, calls, rounds, window, smoke)
        for path in over:
            growth_line(path, grad, lengths[-2], lengths[-1], over[path], smoke)


def blocks(length: int, sizes: list[int], rounds: int, window: float, smoke: bool) -> None:
    """Forward and backward of ``packed_attention`` on a packed row, per block size."""
    ids, pos = (jnp.asarray(x) for x in packed_row(length))
    q, k, v, w = arrays(length)
    calls = {
        size: functools.partial(compiled("packed", True, length, size), q, k, v, ids, pos, w)
        for size in sizes
    }
    for size, seconds in rounds_of(calls, rounds, window).items():
        print(
            json.dumps(
                {
                    "benchmark": "attention",
                    "part": "blocks",
                    "tokens": length,
                    "block": size,
                    "passes": "forward_backward",
                    "seconds": round(statistics.median(seconds), 4),
                    "rounds": rounds,
                    "smoke": smoke,
                }
            ),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="T = 512 and 1024, forward and backward, one round"
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.smoke:
        run([512, 1024], [1024], [1024], [True], rounds=1, window=0.05, smoke=True)
        return
    # the dense path's 32k is compiled only: its scores alone would be 16 GiB
    big = [2048, 8192, 32768]
    run(big, big, [2048, 8192], [False, True], args.rounds, window=0.3, smoke=False)
    blocks(8192, [128, 256, 512, 1024], args.rounds, window=0.3, smoke=False)


if __name__ == "__main__":
    main()
