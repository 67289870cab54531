"""What the object-storage tests run in each process (importable by name)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

import meshfeed
from meshfeed.testing import local_shards


def stream(source: Any) -> list[dict[str, Any]]:
    """Every batch of one shuffled epoch of ``source``, as this process's shards."""
    loader = meshfeed.Loader(
        source,
        global_batch_size=8,
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count())),
        seed=3,
        last_batch="pad",
    )
    return [{k: (v.shape, local_shards(v)) for k, v in b.items()} for b in loader]


def stream_from(url: str, storage_options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``stream`` of the meshfeed folder at ``url`` (on the test's S3 server)."""
    return stream(meshfeed.open_source(url, storage_options=storage_options))
