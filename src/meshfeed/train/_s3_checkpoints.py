"""Checkpoints on S3 (and S3-compatible stores): JAX's array serialization to TensorStore.

Orbax (0.12) cannot write ``s3://``: its TensorStore paths know ``gs://`` and local
folders only (an ``s3://`` path is refused as not absolute), and its temporary folder is
renamed into place, which an object store cannot do. TensorStore itself writes S3 --
given the store's endpoint in its spec, where one is needed (it does not read
``AWS_ENDPOINT_URL``) -- and JAX ships the multi-process writer on top of it
(``jax.experimental.array_serialization``): each process writes the shards its devices
hold, one replica of each, in a background thread, and process 0 runs a commit once
every process has written. So a checkpoint here is a folder per step::

    <root>/<step>/arrays/<i>/             each leaf of the state: a zarr3 array
    <root>/<step>/meshfeed.checkpoint.json the leaves (paths, shapes, dtypes, key kinds)
                                          and the loader's state
    <root>/<step>/commit_success.txt      written last: the step is whole

(the commit file is Orbax's word for the same thing). A step without its commit file is
an unfinished save and is never read; the newest ``max_to_keep`` are kept. Restoring
reads each array's shards for the target's layout, on any number of processes or
devices, as Orbax does. Credentials come as TensorStore finds them (the environment's
``AWS_ACCESS_KEY_ID``, a profile, the instance's role); the endpoint from
``storage_options`` (``endpoint_url``), else ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.data._folder import join, read_json
from meshfeed.data._writer import FolderWriter

FORMAT = "meshfeed.checkpoint/1"
RECORD = "meshfeed.checkpoint.json"
COMMITTED = "commit_success.txt"


def _serialization() -> Any:
    try:
        from jax.experimental.array_serialization import serialization
    except ImportError as error:  # TensorStore missing
        raise ImportError(
            f"checkpoints on s3:// need TensorStore ({error}): pip install "
            "'meshfeed[checkpoint]' (from a clone: pip install -e '.[checkpoint]')."
        ) from None
    return serialization


def endpoint(storage_options: Mapping[str, Any] | None) -> str | None:
    """The S3 endpoint: ``storage_options``' (as s3fs takes it), else the environment's."""
    options = dict(storage_options or {})
    found = options.get("endpoint_url") or dict(options.get("client_kwargs") or {}).get(
        "endpoint_url"
    )
    return found or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


class S3Checkpoints:
    """The checkpoints under an ``s3://`` URL (see the module docstring)."""

    def __init__(
        self, url: str, *, max_to_keep: int, storage_options: Mapping[str, Any] | None
    ) -> None:
        match = re.fullmatch(r"s3://([^/]+)/?(.*)", url)
        if match is None:
            raise ValueError(f"{url!r} names no bucket; pass s3://BUCKET/PATH.")
        self.directory = url.rstrip("/")
        self._bucket, self._prefix = match.group(1), match.group(2).strip("/")
        self._max_to_keep = max_to_keep
        self._options = storage_options
        self._writer = FolderWriter(self.directory, storage_options)
        self._fs: Any = self._writer.fs
        region = dict(dict(storage_options or {}).get("client_kwargs") or {}).get("region_name")
        self._store: dict[str, Any] = {"driver": "s3", "bucket": self._bucket}
        found = endpoint(storage_options)
        if found:
            self._store["endpoint"] = found
        if region or found:
            self._store["aws_region"] = region or "us-east-1"
        if os.environ.get("AWS_ACCESS_KEY_ID"):  # not the whole chain, which logs each miss
            self._store["aws_credentials"] = {"type": "environment"}
        self._manager = _serialization().GlobalAsyncCheckpointManager()

    def steps(self) -> list[int]:
        """The whole steps saved (their commit file written), oldest first."""
        fs, root = self._fs, self._writer.path.rstrip("/")
        try:
            found = fs.glob(f"{root}/*/{COMMITTED}")
        except FileNotFoundError:
            return []
        names = [p.rstrip("/").split("/")[-2] for p in found]
        return sorted(int(n) for n in names if n.isdigit())

    def latest_step(self) -> int | None:
        """The newest whole step, or ``None``."""
        self._manager.wait_until_finished()
        steps = self.steps()
        return steps[-1] if steps else None

    def _spec(self, step: int, index: int) -> dict[str, Any]:
        path = "/".join(p for p in (self._prefix, str(step), "arrays", str(index)) if p)
        return {"driver": "zarr3", "kvstore": {**self._store, "path": path + "/"}}

    def save(self, step: int, state: Any, loader_state: Mapping[str, Any] | None) -> None:
        """Starts saving ``state`` as ``step`` (after the save before it is done): returns
        once the arrays are copied off the devices; the writes go on in the background."""
        self._manager.wait_until_finished()
        flat = jax.tree_util.tree_flatten_with_path(state)[0]
        leaves, arrays = [], []
        for path, leaf in flat:
            if not isinstance(leaf, jax.Array):
                raise TypeError(
                    f"a checkpoint on S3 holds jax.Arrays; the state's "
                    f"{jax.tree_util.keystr(path)} is a {type(leaf).__name__}."
                )
            key = jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
            value = jax.random.key_data(leaf) if key else leaf
            described = {
                "path": jax.tree_util.keystr(path),
                "shape": list(value.shape),
                "dtype": str(value.dtype),
                "key": str(jax.random.key_impl(leaf)) if key else None,
            }
            leaves.append(described)
            arrays.append(value)
        record = {"format": FORMAT, "step": step, "leaves": leaves, "loader": loader_state}
        specs = [self._spec(step, i) for i in range(len(arrays))]
        self._manager.serialize(arrays, specs, on_commit_callback=lambda: self._commit(record))

    def _commit(self, record: dict[str, Any]) -> None:
        """Process 0, once every process has written: the record, then the commit file,
        then the steps past ``max_to_keep`` removed."""
        step = str(record["step"])
        self._writer.write(f"{step}/{RECORD}", json.dumps(record).encode())
        self._writer.write(f"{step}/{COMMITTED}", b"")
        for old in self.steps()[: -self._max_to_keep]:
            self._fs.rm(f"{self._writer.path.rstrip('/')}/{old}", recursive=True)

    def restore(self, target: Any, step: int) -> tuple[Any, Any]:
        """The state of ``step`` laid out like ``target``, and the loader's state saved
        with it (``None`` if none was)."""
        self._manager.wait_until_finished()
        record = read_json(join(self.directory, f"{step}/{RECORD}"), self._options)
        if record is None or record.get("format") != FORMAT:
            raise FileNotFoundError(f"no checkpoint of step {step} under {self.directory}.")
        flat, tree = jax.tree_util.tree_flatten_with_path(target)
        saved = record["leaves"]
        paths = [jax.tree_util.keystr(p) for p, _ in flat]
        if paths != [leaf["path"] for leaf in saved]:
            raise ValueError(
                f"the checkpoint of step {step} under {self.directory} holds a state of "
                f"other leaves ({[leaf['path'] for leaf in saved][:6]}...) than the target "
                f"({paths[:6]}...); restore it into a state built like the one saved."
            )
        shardings, shapes, dtypes = [], [], []
        for (_, leaf), entry in zip(flat, saved, strict=True):
            sharding = leaf.sharding
            if entry["key"] is not None and isinstance(sharding, NamedSharding):
                sharding = NamedSharding(sharding.mesh, P(*sharding.spec, None))
            shardings.append(sharding)
            shapes.append(tuple(entry["shape"]))
            dtypes.append(np.dtype(entry["dtype"]))
        specs = [self._spec(step, i) for i in range(len(saved))]
        arrays = _serialization().run_deserialization(shardings, specs, shapes, dtypes)
        values = [
            a if e["key"] is None else jax.random.wrap_key_data(a, impl=e["key"])
            for a, e in zip(arrays, saved, strict=True)
        ]
        return jax.tree.unflatten(tree, values), record.get("loader")

    def wait(self) -> None:
        """Returns once the last save is whole (raises what its writes raised)."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self.wait()
