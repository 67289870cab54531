"""Packed rows in a context layout, and the loaders over them that tests run in every
process through ``run_in_processes``."""

from __future__ import annotations

from typing import Any

import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
from meshfeed.testing import local_shards
from pack_fns import documents

SEQ_LEN = 32
BATCH = 4


def packed(n: int = 40) -> meshfeed.sources.Packed:
    """``n`` documents (token = document * 10_000 + position) packed into rows of 32."""
    docs = documents(n)
    source = meshfeed.ArraySource(
        {
            "tokens": meshfeed.Ragged.from_list(docs, dtype=np.int32),
            "weights": meshfeed.Ragged.from_list([d % 3 == 0 for d in docs], dtype=bool),
        }
    )
    return meshfeed.pack(source, SEQ_LEN)


def sharding(cp: int) -> NamedSharding:
    """Rows over ``data``, each row's tokens over ``context`` (``cp`` devices)."""
    mesh = meshfeed.make_mesh(data=8 // cp, context=cp)
    return NamedSharding(mesh, P("data", "context"))


def loader(
    strategy: meshfeed.types.Strategy, cp: int = 4, kind: Any = "dual_chunk", **kwargs: Any
) -> meshfeed.Loader:
    """A loader of the laid-out packed rows on a ``data x context`` mesh of 8 devices."""
    return meshfeed.Loader(
        meshfeed.sources.context_layout(packed(), cp, kind),
        global_batch_size=BATCH,
        sharding=sharding(cp),
        strategy=strategy,
        prefetch=0,
        **kwargs,
    )


def local_stream(strategy: meshfeed.types.Strategy) -> dict[str, Any]:
    """This process's shards of every batch of one epoch, and the ids of each step."""
    it = loader(strategy)
    batches = [{k: (x.shape, local_shards(x)) for k, x in b.items()} for b in it]
    return {"batches": batches, "ids": [it.ids(k) for k in range(len(batches))]}


def assemble(results: list[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
    """Global numpy batches from every process's local shards."""
    out = []
    for step in range(len(results[0]["batches"])):
        batch = {}
        for name, (shape, shards) in results[0]["batches"][step].items():
            full = np.zeros(shape, shards[0][1].dtype)
            for r in results:
                for index, data in r["batches"][step][name][1]:
                    full[index] = data
            batch[name] = full
        out.append(batch)
    return out


def run_strategies(strategies: tuple[meshfeed.types.Strategy, ...]) -> dict[str, Any]:
    """``local_stream`` of each strategy, one after another."""
    return {strategy: local_stream(strategy) for strategy in strategies}
