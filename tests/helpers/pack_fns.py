"""Documents, packed sources and the functions packing tests run in every process."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
from meshfeed.testing import local_shards

SEQ_LEN = 32
SPAN = 10_000  # token value = document * SPAN + position: every token tells its origin


def documents(n: int = 300, seed: int = 0, longest: int = 90) -> list[np.ndarray]:
    """``n`` documents of 0 to ``longest`` tokens (some longer than SEQ_LEN, some empty)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, longest, n)
    return [np.arange(k, dtype=np.int32) + SPAN * i for i, k in enumerate(lengths)]


def source(n: int = 300) -> meshfeed.ArraySource:
    docs = documents(n)
    return meshfeed.ArraySource(
        {
            "tokens": meshfeed.Ragged.from_list(docs, dtype=np.int32),
            "weights": meshfeed.Ragged.from_list([d % 3 == 0 for d in docs], dtype=bool),
        }
    )


def packed(**kwargs: Any) -> meshfeed.sources.Packed:
    return meshfeed.pack(source(), SEQ_LEN, **kwargs)


def check_rows(rows: dict[str, np.ndarray]) -> list[tuple[int, int]]:
    """Checks segment ids and positions against the tokens; returns (document, position)
    of every real token."""
    seen = []
    for tokens, segments, positions, weights in zip(
        rows["tokens"], rows["segment_ids"], rows["positions"], rows["weights"], strict=True
    ):
        real = segments > 0
        assert not tokens[~real].any() and not positions[~real].any()
        assert np.all(np.diff(segments[real]) >= 0)  # documents one after another
        count = len(np.unique(segments[real]))
        assert np.array_equal(np.unique(segments[real]), np.arange(1, count + 1))
        for s in np.unique(segments[real]):
            where = np.flatnonzero(segments == s)
            assert np.array_equal(where, np.arange(where[0], where[-1] + 1))  # contiguous
            doc, position = np.divmod(tokens[where], SPAN)
            assert len(np.unique(doc)) == 1  # one document per segment
            assert np.array_equal(positions[where], np.arange(len(where)))  # from 0
            assert np.array_equal(np.diff(position), np.ones(len(where) - 1))
            assert np.array_equal(weights[where], tokens[where] % 3 == 0)  # packed alongside
            seen += list(zip(doc.tolist(), position.tolist(), strict=True))
    return seen


def epoch(num_steps: int | None = None, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """This process's shards of one padded epoch of the packed rows (from ``state``), and
    the digest of the plan this process made of them."""
    mesh = meshfeed.make_mesh(data=jax.device_count())
    rows = packed()
    loader = meshfeed.Loader(
        rows,
        global_batch_size=8,
        sharding=NamedSharding(mesh, P("data", None)),
        last_batch="pad",
        seed=5,
    )
    if state is not None:
        loader.restore(state)
    batches = []
    for batch in loader:
        batches.append({k: (v.shape, local_shards(v)) for k, v in batch.items()})
        if num_steps is not None and len(batches) == num_steps:
            break
    plan = rows.fingerprint["pack"]["plan"]
    return {
        "batches": batches,
        "state": loader.state(),
        "process": jax.process_index(),
        "plan": plan,
    }


def plan_digest() -> str:
    return packed().fingerprint["pack"]["plan"]
