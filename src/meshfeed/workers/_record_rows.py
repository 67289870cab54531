"""What a record transform does to a batch's rows, wherever it runs.

``fn(record, rng) -> record`` runs once per example a process loads (decode, augment).
Its random generator is a PCG64 seeded from a hash of ``(seed, epoch, example_id)``, so
the output depends on nothing but the example, the seed and the epoch: not on the number
of workers, their kind, nor the number of processes. (It is re-seeded in place for
speed: use it within the call.) ``transform_rows`` runs ``fn`` over rows into output
arrays, in the loading thread, a worker thread or a worker process alike; this module
imports no JAX, so worker processes start fast.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from meshfeed.core._permutation import M64, hash64
from meshfeed.data._sources import FieldSpec

EXAMPLE_ID = "meshfeed_example_id"  # set on an exception by the work that raised it
RecordFn = Callable[[dict[str, Any], np.random.Generator], dict[str, Any]]
"""``fn(record, rng) -> record``: one example's fields in, its new fields out; ``rng``
seeded from ``(seed, epoch, example id)``."""
_M128 = (1 << 128) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment


def _splitmix64(z: Any) -> Any:
    """SplitMix64's step, on a Python int or on a ``uint64`` array (which wraps)."""
    if isinstance(z, np.ndarray):
        return hash64(z + np.uint64(_GOLDEN))
    return hash64((z + _GOLDEN) & M64)


def example_keys(seed: int, epoch: int, ids: np.ndarray) -> tuple[list[int], list[int]]:
    """The two 64-bit keys of each example's generator, for all of ``ids`` at once."""
    base = _splitmix64(_splitmix64(seed) ^ epoch)
    with np.errstate(over="ignore"):
        a = _splitmix64(np.uint64(base) ^ np.asarray(ids).astype(np.uint64))
        b = _splitmix64(a)
    return a.tolist(), b.tolist()


class RecordRng:
    """Per-example generators without a SeedSequence per example.

    ``seed_with(a, b)`` re-seeds one PCG64 from an example's two keys (``example_keys``
    hashes ``(seed, epoch, id)`` for a chunk of examples at once with SplitMix64) and
    returns its ``Generator``, which is therefore valid until the next call: a record
    transform must use it within its call, not keep it. It costs about 3 us; a new
    ``default_rng`` costs 20 and a 32x32 PNG decode 100 on this machine.
    """

    def __init__(self) -> None:
        self._bits = np.random.PCG64(0)
        self._generator = np.random.Generator(self._bits)

    def seed_with(self, a: int, b: int) -> np.random.Generator:
        self._bits.state = {
            "bit_generator": "PCG64",
            "state": {"state": (a << 64) | b, "inc": ((b << 1) | 1) & _M128},
            "has_uint32": 0,
            "uinteger": 0,
        }
        return self._generator

    def for_example(self, seed: int, epoch: int, example_id: int) -> np.random.Generator:
        (a,), (b,) = example_keys(seed, epoch, np.asarray([example_id]))
        return self.seed_with(a, b)


def record_rng(seed: int, epoch: int, example_id: int) -> np.random.Generator:
    """A fresh generator in the state ``fn`` sees for this example."""
    return RecordRng().for_example(seed, epoch, example_id)


def _record(batch: Mapping[str, np.ndarray], i: int) -> dict[str, Any]:
    return {k: v[i] for k, v in batch.items()}


def _check(
    out: Any, spec: Mapping[str, FieldSpec] | None, example_id: int
) -> dict[str, np.ndarray]:
    if not isinstance(out, Mapping):
        raise TypeError(
            f"record_transform returned {type(out).__name__} for example {example_id}; "
            "return a dict of field -> array."
        )
    arrays = {k: np.asarray(v) for k, v in out.items()}
    if spec is not None:
        got = {k: FieldSpec(a.shape, a.dtype) for k, a in arrays.items()}
        if got != dict(spec):
            raise ValueError(
                f"record_transform returned {got} for example {example_id}, but {dict(spec)} "
                "for the first example; every record must come out with the same fields, "
                "shapes and dtypes (pad or crop to a fixed size)."
            )
    return arrays


def transform_rows(
    fn: RecordFn,
    batch: Mapping[str, np.ndarray],
    ids: np.ndarray,
    outputs: Mapping[str, np.ndarray],
    start: int,
    seed: int,
    epoch: int,
    current: np.ndarray | None = None,
) -> None:
    """Transforms the rows of ``batch`` into ``outputs[start:]`` (padding, id < 0, is
    left as it is). An exception carries the failing example's id as ``EXAMPLE_ID``;
    ``current[0]``, if given, holds the id of the example being transformed (a worker's
    parent reads it there if the worker dies)."""
    rng = RecordRng()
    spec = {k: FieldSpec(v.shape[1:], v.dtype) for k, v in outputs.items()}
    fields = list(spec.items())
    keys_a, keys_b = example_keys(seed, epoch, ids)
    for i, example_id in enumerate(ids.tolist()):
        if example_id < 0:
            continue
        if current is not None:
            current[0] = example_id
        try:
            out = fn(_record(batch, i), rng.seed_with(keys_a[i], keys_b[i]))
            try:  # the common case, checked without building anything
                if len(out) != len(fields):
                    raise KeyError
                for name, s in fields:
                    value = out[name]
                    if value.shape != s.shape or value.dtype != s.dtype:
                        raise KeyError
                    outputs[name][start + i] = value
            except (KeyError, AttributeError, TypeError):
                checked = _check(out, spec, int(example_id))  # raises with the full story
                for name, value in checked.items():
                    outputs[name][start + i] = value
        except Exception as error:
            with contextlib.suppress(AttributeError):  # a worker reports the example
                setattr(error, EXAMPLE_ID, int(example_id))
            raise


def probe_spec(
    fn: RecordFn, batch: Mapping[str, np.ndarray], ids: np.ndarray, seed: int, epoch: int
) -> dict[str, FieldSpec]:
    """The output fields of ``fn``, from its result on the first real row of ``batch``."""
    for i, example_id in enumerate(ids):
        if example_id >= 0:
            out = _check(
                fn(_record(batch, i), record_rng(seed, epoch, example_id)), None, example_id
            )
            return {k: FieldSpec(tuple(a.shape), a.dtype) for k, a in out.items()}
    raise ValueError("probe_spec needs at least one real row.")


def chunks(rows: int, count: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of ``count`` near-equal, non-empty chunks of ``rows`` rows."""
    bounds = np.linspace(0, rows, min(rows, count) + 1).astype(int)
    return [(int(lo), int(hi)) for lo, hi in itertools.pairwise(bounds) if hi > lo]
