"""Checking that a loader restored at any step continues the uninterrupted stream."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np


def local_shards(x: jax.Array) -> list[tuple[tuple[slice, ...], np.ndarray]]:
    """This process's shards of ``x`` as (global index, numpy data), by device id."""
    shards = sorted(x.addressable_shards, key=lambda s: s.device.id)
    return [(s.index, np.asarray(s.data)) for s in shards]


def assert_resumes_identically(
    make_loader: Callable[[], Any], *, max_steps: int | None = None
) -> int:
    """Restores a fresh loader at every step and checks it yields the same remaining batches.

    ``make_loader()`` must build the same loader each call. Compares this process's
    shards, so it holds on every process of a multi-process run.

    Returns:
      The number of steps checked.
    """
    reference = make_loader()
    states: list[Mapping[str, Any]] = []
    stream: list[dict[str, list[tuple[tuple[slice, ...], np.ndarray]]]] = []
    for batch in reference:
        stream.append({k: local_shards(v) for k, v in batch.items()})
        states.append(reference.state())
        if max_steps is not None and len(stream) >= max_steps:
            break
    starts = [None, *states[:-1]]
    for k, state in enumerate(starts):
        loader = make_loader()
        if state is not None:
            loader.restore(state)
        for j, batch in enumerate(loader, start=k):
            if j >= len(stream):
                break
            for name, shards in stream[j].items():
                got = local_shards(batch[name])
                for (index, want), (got_index, have) in zip(shards, got, strict=True):
                    if index != got_index or not np.array_equal(want, have):
                        raise AssertionError(
                            f"restored at step {k}, step {j} field {name!r} differs from "
                            "the uninterrupted stream."
                        )
    return len(stream)
