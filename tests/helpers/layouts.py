"""The mesh x sharding layouts every strategy is checked on, and the checks themselves.

Shared by the single-process tests and the functions that ``run_in_processes`` runs in
each process, so both check exactly the same thing.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
from meshfeed.testing import local_shards

NUM_EXAMPLES = 100
GLOBAL_BATCH_SIZE = 16
SEQ_LEN = 8
LAYOUTS = ("data8", "data4_model2", "data2_model4_2d", "data_model_batch")


class CountingSource:
    """An ArraySource that records every id it is asked for."""

    def __init__(self, source: meshfeed.ArraySource) -> None:
        self._source = source
        self.requests: list[np.ndarray] = []

    @property
    def fields(self):
        return self._source.fields

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        self.requests.append(np.array(ids))
        return self._source[ids]


def make_arrays(n: int = NUM_EXAMPLES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "tokens": rng.integers(0, 50_000, size=(n, SEQ_LEN), dtype=np.int32),
        "image": rng.integers(0, 256, size=(n, 4, 4), dtype=np.uint8),
        "label": np.arange(n, dtype=np.int32),
    }


def _model_across_processes(data: int, model: int) -> list[Any]:
    """Devices ordered so that the devices of one model replica are far apart in
    jax.devices() order -- on several processes, whenever the process layout allows."""
    devices = jax.devices()
    return list(np.asarray(devices, dtype=object).reshape(model, data).T.reshape(-1))


def make_layout(
    name: str, axis_types: meshfeed.types.AxisTypes = "auto"
) -> dict[str, NamedSharding]:
    """A sharding per field for one named layout."""
    if name == "data8":
        mesh = meshfeed.make_mesh(data=8, axis_types=axis_types)
        s = NamedSharding(mesh, P("data"))
        return {"tokens": s, "image": s, "label": s}
    if name == "data4_model2":
        mesh = meshfeed.make_mesh(
            data=4, model=2, axis_types=axis_types, devices=_model_across_processes(4, 2)
        )
        s = NamedSharding(mesh, P("data"))
        return {"tokens": s, "image": s, "label": s}
    if name == "data2_model4_2d":
        mesh = meshfeed.make_mesh(data=2, model=4, axis_types=axis_types)
        return {
            "tokens": NamedSharding(mesh, P("data", "model")),
            "image": NamedSharding(mesh, P("data")),
            "label": NamedSharding(mesh, P("data")),
        }
    if name == "data_model_batch":
        mesh = meshfeed.make_mesh(data=4, model=2, axis_types=axis_types)
        s = NamedSharding(mesh, P(("data", "model")))
        return {"tokens": s, "image": s, "label": s}
    raise ValueError(name)


def expected_batch(arrays: dict[str, np.ndarray], ids: np.ndarray) -> dict[str, np.ndarray]:
    """``source[ids]`` with zero rows and a False mask where ids are padding."""
    valid = ids >= 0
    out = {}
    for name, a in arrays.items():
        full = np.zeros((len(ids), *a.shape[1:]), a.dtype)
        full[valid] = a[ids[valid]]
        out[name] = full
    out["mask"] = valid
    return out


def needed_ids(sharding: NamedSharding, ids: np.ndarray) -> np.ndarray:
    """Ids this process's devices hold, per JAX's own index map."""
    rows = set()
    for index in sharding.addressable_devices_indices_map((len(ids),)).values():
        assert index is not None
        rows.update(range(*index[0].indices(len(ids))[:2]))
    return ids[sorted(rows)]


def check_strategy(
    strategy: meshfeed.types.Strategy, layout: str, *, last_batch: meshfeed.types.LastBatch = "pad"
) -> dict[str, Any]:
    """Runs a loader over one epoch and checks every batch on this process.

    Checks: values equal source[schedule ids] (local shards, every field), the
    sharding is the one asked for, replicas agree by a collective, and with
    per_process the source is asked for exactly the rows this process needs.
    """
    arrays = make_arrays()
    source = CountingSource(meshfeed.ArraySource(arrays))
    shardings = make_layout(layout)
    loader = meshfeed.Loader(
        source,
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=shardings,
        strategy=strategy,
        seed=3,
        last_batch=last_batch,
    )
    steps = 0
    needed = []
    for step, batch in enumerate(loader):
        ids = loader.ids(step)
        if strategy == "reshard":
            batch = meshfeed.reshard(batch, shardings)
        want = expected_batch(arrays, ids)
        assert set(batch) == set(want), (set(batch), set(want))
        for name, array in batch.items():
            if name != "mask":
                assert array.sharding == shardings[name], (name, array.sharding)
            assert array.shape == want[name].shape
            for index, data in local_shards(array):
                np.testing.assert_array_equal(data, want[name][index], err_msg=f"{name} {index}")
        meshfeed.inspect.check_replicas(batch)  # a collective: replicas on other processes too
        need = needed_ids(shardings["label"], ids)
        needed.append(need[need >= 0])
        steps += 1
    assert steps == len(loader)
    if strategy == "per_process":
        # One read per step (the read-ahead reads several steps at once, in any order),
        # of exactly the rows this process's devices hold, each once; none where they
        # are all padding.
        needed = [need for need in needed if len(need)]
        assert len(source.requests) == len(needed), (len(source.requests), len(needed))
        for got in source.requests:
            assert len(np.unique(got)) == len(got), "an id was read twice"
        assert sorted(tuple(np.sort(got)) for got in source.requests) == sorted(
            tuple(np.sort(need)) for need in needed
        )
    return {"strategy": strategy, "layout": layout, "steps": steps, "chosen": loader.strategy}


def check_all() -> list[dict[str, Any]]:
    """Every strategy on every layout, on this process."""
    return [check_strategy(s, layout) for s in meshfeed.inspect.STRATEGIES for layout in LAYOUTS]
