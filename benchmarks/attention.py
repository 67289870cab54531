"""Attention without a dense mask: packed_attention's memory and time, against the dense path
(``segment_mask`` + ``jax.nn.dot_product_attention(mask=...)``), one call on CPU.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from memory_fns import MB, memory_figures, peak_bytes
from packing import lengths, source

import meshfeed

HEADS, DIM = 4, 64


def packed_row(length: int) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids and positions ``[1, length]`` of a row of ``meshfeed.pack`` of
    documents of log-normal lengths, long ones split."""
    documents = source(lengths(4 * length // 400 + 8))
    row = meshfeed.pack(documents, length, long_docs="split")[np.array([0])]
    return row["segment_ids"], row["positions"]


def compiled(path: str, grad: bool, length: int, block: int | None = None) -> Any:
    """``f(q, k, v, segment_ids, positions, w)`` of one path compiled for ``[1, length]``
    rows (nothing allocated): the output, or the gradient of ``sum(out * w)`` in q, k, v."""
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

    call = jax.grad(loss, argnums=(0, 1, 2)) if grad else lambda *args: f(*args[:5])
    floats = jax.ShapeDtypeStruct((1, length, HEADS, DIM), jnp.float32)
    ints = jax.ShapeDtypeStruct((1, length), jnp.int32)
    return jax.jit(call).lower(floats, floats, floats, ints, ints, floats).compile()


def arrays(length: int, ids: np.ndarray, pos: np.ndarray) -> tuple[jax.Array, ...]:
    """q, k, v, the segment ids, the positions and the loss's weights ``w``."""
    q, k, v, w = (
        jax.random.normal(key, (1, length, HEADS, DIM))
        for key in jax.random.split(jax.random.key(0), 4)
    )
    return q, k, v, jnp.asarray(ids), jnp.asarray(pos), w


def seconds_per_call(run: Callable[[], Any], window: float) -> float:
    """Seconds a call of ``run`` takes, its result ready, over ``window`` seconds of calls."""
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < window:
        jax.block_until_ready(run())
        calls += 1
    return elapsed / calls


def rounds_of(calls: dict[str, Callable[[], Any]], rounds: int, window: float) -> list[dict]:
    """Seconds per call of each entry (warmed first), per round, in rotating order."""
    for call in calls.values():
        jax.block_until_ready(call())
    timed = {name: functools.partial(seconds_per_call, c, window) for name, c in calls.items()}
    return in_rounds(timed, rounds)


def memory(out: Callable[..., Any], path: str, length: int, call: Any) -> float:
    """Emits the call's memory; returns its peak over the bytes of q, k and v."""
    stats = call.memory_analysis()
    qkv = 3 * length * HEADS * DIM * 4
    over = peak_bytes(stats) / qkv
    shape = {"tokens": length, "heads": HEADS, "head_dim": DIM, "qkv_mb": round(qkv / MB, 2)}
    figures = memory_figures(stats, digits=2) | {"peak_over_qkv": round(over, 3)}
    out(part="memory", path=path, **shape, **figures)
    return over


def timing(out: Callable[..., Any], length: int, calls: dict, rounds: int, window: float) -> None:
    """Seconds per call of each compiled path on a packed row and on one document."""
    one_document = (np.ones((1, length), np.int32), np.arange(length, dtype=np.int32)[None])
    rows = {"packed_row": packed_row(length), "one_document": one_document}
    for row, (ids, pos) in rows.items():
        args = arrays(length, ids, pos)
        entries = {path: functools.partial(call, *args) for path, call in calls.items()}
        per_round = rounds_of(entries, rounds, window)
        line = {"part": "time", "row": row, "tokens": length, "documents": int(ids.max())}
        line |= {f"{path}_s": round(median_of(per_round, path) or 0.0, 4) for path in calls}
        if "dense" in calls:
            line["packed_over_dense"] = median_ratio(per_round, "packed", "dense")
        out(**line, rounds=rounds)


def run(smoke: bool, rounds: int) -> None:
    """Memory at every length and its growth over the last doubling, and time (against
    the dense path's where it fits), each call compiled once for both."""
    lengths = [512, 1024] if smoke else [2048, 8192, 32768]
    # the dense path's 32k is compiled only: its scores alone would be 16 GiB
    timed, dense_timed = ([1024], [1024]) if smoke else (lengths, [2048, 8192])
    for grad in [True] if smoke else [False, True]:
        passes = "forward_backward" if grad else "forward"
        out = functools.partial(emit, "attention", smoke=smoke, passes=passes)
        over: dict[str, dict[int, float]] = {"packed": {}, "dense": {}}
        for length in lengths:
            calls = {path: compiled(path, grad, length) for path in over}
            for path, call in calls.items():
                over[path][length] = memory(out, path, length, call)
            if length not in dense_timed:
                del calls["dense"]
            if length in timed:
                timing(out, length, calls, rounds, window=0.05 if smoke else 0.3)
        low, high = lengths[-2], lengths[-1]
        for path, peak in over.items():
            doubling = (peak[high] / peak[low]) ** (1 / np.log2(high / low))
            at = {"path": path, "from_tokens": low, "to_tokens": high}
            growth = {"peak_over_qkv_per_doubling": round(doubling, 3)}
            out(part="memory_growth", **at, **growth, peak_per_doubling=round(2 * doubling, 3))


def blocks(length: int, sizes: list[int], rounds: int) -> None:
    """Forward and backward of ``packed_attention`` on a packed row, per block size."""
    args = arrays(length, *packed_row(length))
    calls = {str(n): functools.partial(compiled("packed", True, length, n), *args) for n in sizes}
    per_round = rounds_of(calls, rounds, window=0.3)
    for size in sizes:
        seconds = round(median_of(per_round, str(size)) or 0.0, 4)
        at = {"part": "blocks", "passes": "forward_backward", "tokens": length, "block": size}
        emit("attention", smoke=False, **at, seconds=seconds, rounds=rounds)


def main() -> None:
    use_cpu_devices(count=1)
    args = arguments(__doc__, rounds=3)
    run(args.smoke, args.rounds)
    if not args.smoke:
        blocks(8192, [128, 256, 512, 1024], args.rounds)


if __name__ == "__main__":
    main()
