"""Attention without a dense mask: packed_attention's memory and time, against the dense path.

One call on CPU (batch 1, 4 heads of 64, float32, a row of ``T`` tokens) of
``meshfeed.train.packed_attention`` against ``segment_mask`` +
``jax.nn.dot_product_attention(mask=...)``: ``memory`` (compiled ``memory_analysis()``,
forward and forward + backward, at T = 2k, 8k, 32k; compiled only, so the dense 32k
that would not fit is still a figure; the growth per doubling from 8k to 32k, goal
<= 1.1), ``time`` (seconds a call on a packed row and on a row of one document, rotating
rounds, the median of the per-round ratios) and ``blocks`` (the block size at 8k).
``--smoke``: T = 512 and 1024, forward and backward, one round.
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

import meshfeed

HEADS, DIM = 4, 64


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
    _emit(
        "memory",
        grad,
        smoke,
        path=path,
        tokens=length,
        heads=HEADS,
        head_dim=DIM,
        qkv_mb=round(qkv / MB, 2),
        **memory_figures(stats, digits=2),
        peak_over_qkv=round(peak_bytes(stats) / qkv, 3),
    )
    return peak_bytes(stats) / qkv


def growth_line(
    path: str, grad: bool, low: int, high: int, over: dict[int, float], smoke: bool
) -> None:
    per_doubling = (over[high] / over[low]) ** (1 / np.log2(high / low))
    _emit(
        "memory_growth",
        grad,
        smoke,
        path=path,
        from_tokens=low,
        to_tokens=high,
        peak_over_qkv_per_doubling=round(per_doubling, 3),
        peak_per_doubling=round(2 * per_doubling, 3),
    )


def _passes(grad: bool) -> str:
    return "forward_backward" if grad else "forward"


def _emit(part: str, grad: bool, smoke: bool, **fields: Any) -> None:
    emit("attention", smoke=smoke, part=part, passes=_passes(grad), **fields)


def _seconds_per_call(run: Callable[[], Any], window: float) -> float:
    calls, start = 0, time.perf_counter()
    while True:
        jax.block_until_ready(run())
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= window:
            return elapsed / calls


def rounds_of(calls: dict[Any, Callable[[], Any]], rounds: int, window: float) -> list[dict]:
    """Seconds per call of each entry (warmed first), per round, in rotating order."""
    for call in calls.values():
        jax.block_until_ready(call())
    timed = {name: functools.partial(_seconds_per_call, c, window) for name, c in calls.items()}
    return in_rounds(timed, rounds)


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
        per_round = rounds_of(
            {p: functools.partial(c, *args) for p, c in calls.items()}, rounds, window
        )
        line: dict[str, Any] = {
            "part": "time",
            "row": row,
            "tokens": length,
            "documents": int(ids.max()),
            "passes": _passes(grad),
            "rounds": rounds,
        }
        for path in calls:
            line[f"{path}_s"] = round(median_of(per_round, path) or 0.0, 4)
        if "dense" in calls:
            line["packed_over_dense"] = median_ratio(per_round, "packed", "dense")
        emit("attention", smoke=smoke, **line)


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
        str(size): functools.partial(compiled("packed", True, length, size), q, k, v, ids, pos, w)
        for size in sizes
    }
    per_round = rounds_of(calls, rounds, window)
    for size in sizes:
        seconds = round(median_of(per_round, str(size)) or 0.0, 4)
        _emit("blocks", True, smoke, tokens=length, block=size, seconds=seconds, rounds=rounds)


def main() -> None:
    use_cpu_devices(count=1)
    args = arguments(__doc__, rounds=3)
    if args.smoke:
        run([512, 1024], [1024], [1024], [True], rounds=1, window=0.05, smoke=True)
        return
    # the dense path's 32k is compiled only: its scores alone would be 16 GiB
    big = [2048, 8192, 32768]
    run(big, big, [2048, 8192], [False, True], args.rounds, window=0.3, smoke=False)
    blocks(8192, [128, 256, 512, 1024], args.rounds, window=0.3, smoke=False)


if __name__ == "__main__":
    main()
