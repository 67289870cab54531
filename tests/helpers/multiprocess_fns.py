"""Functions that tests run in every process through ``run_in_processes``.

They live in an importable module (not a test file) so that each process can unpickle
them by name.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
from layouts import make_arrays, make_layout
from meshfeed.testing import local_shards


def run_streams(states: dict[meshfeed.types.Strategy, Any], skip: int) -> dict[str, Any]:
    """``run_stream(state, skip, strategy)`` for each strategy's state, one after another."""
    return {strategy: run_stream(state, skip, strategy) for strategy, state in states.items()}


def run_stream(
    state: dict[str, Any] | None, skip: int, strategy: meshfeed.types.Strategy
) -> dict[str, Any]:
    """Skips ``skip`` steps (or restores ``state``), then records every later batch."""
    loader = meshfeed.Loader(
        meshfeed.ArraySource(make_arrays(60)),
        global_batch_size=8,
        sharding=make_layout("data4_model2"),
        strategy=strategy,
        num_epochs=2,
        last_batch="pad",
    )
    if state is not None:
        loader.restore(state)
    else:
        it = iter(loader)
        for _ in range(skip):
            next(it)
    taken = loader.state()
    batches = [
        {
            name: (x.shape, local_shards(x))
            for name, x in meshfeed.reshard(b, loader.sharding).items()
        }
        for b in loader
    ]
    return {"state": taken, "batches": batches, "process": jax.process_index()}


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


def disagreeing_replicas() -> dict[str, Any]:
    """Builds a batch whose model replicas, on different processes, hold different rows."""
    mesh = meshfeed.make_mesh(
        data=4,
        model=2,
        devices=list(np.asarray(jax.devices(), dtype=object).reshape(2, 4).T.reshape(-1)),
    )
    s = NamedSharding(mesh, P("data"))
    same = np.arange(8, dtype=np.float32)
    differ = same + 100 * jax.process_index()
    meshfeed.inspect.check_replicas({"same": jax.make_array_from_process_local_data(s, same, (8,))})
    try:
        meshfeed.inspect.check_replicas(
            {"differ": jax.make_array_from_process_local_data(s, differ, (8,))}
        )
    except ValueError as error:
        return {"error": str(error)}
    return {"error": None}


def psum_of_process_ids() -> float:
    mesh = meshfeed.make_mesh(data=jax.device_count())
    s = NamedSharding(mesh, P("data"))
    local = np.full(jax.local_device_count(), jax.process_index(), np.float32)
    x = jax.make_array_from_process_local_data(s, local, (jax.device_count(),))
    return float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x))


def fail_on_process_one() -> None:
    if jax.process_index() == 1:
        raise RuntimeError("process one gives up")
    psum_of_process_ids()  # waits in a collective for process 1, which never comes


def layout_text() -> str:
    mesh = meshfeed.make_mesh(data=4, model=2)
    return meshfeed.show_sharding(NamedSharding(mesh, P("data", "model")), shape=(16, 8))


class _DisagreeingSource:
    """Each process sees different values: replicas built from it cannot agree."""

    def __init__(self) -> None:
        self._source = meshfeed.ArraySource(make_arrays(64))

    @property
    def fields(self) -> Any:
        return self._source.fields

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        out = self._source[ids]
        return {k: v + jax.process_index() for k, v in out.items()}


def check_every_catches_disagreeing_processes() -> str:
    loader = meshfeed.Loader(
        _DisagreeingSource(),
        global_batch_size=8,
        sharding=make_layout("data4_model2"),
        check_every=1,
    )
    try:
        next(iter(loader))
    except ValueError as error:
        return str(error)
    return "no error"


def plan_against_reads() -> list[tuple[str, str, int, int]]:
    """(layout, strategy, rows the plan says, rows the source was asked for) per case."""
    from layouts import CountingSource

    out = []
    for layout in ("data8", "data4_model2", "data2_model4_2d", "data_model_batch"):
        for strategy in meshfeed.inspect.STRATEGIES:
            source = CountingSource(meshfeed.ArraySource(make_arrays()))
            loader = meshfeed.Loader(
                source,
                global_batch_size=16,
                sharding=make_layout(layout),
                strategy=strategy,
                prefetch=0,
                shuffle=False,
            )
            next(iter(loader))
            said = loader.plan.costs[loader.strategy].rows_read[jax.process_index()]
            read = sum(len(r) for r in source.requests)
            out.append((layout, strategy, said, read))
    return out


def meshes_by_topology() -> dict[str, Any]:
    """Each device's process over meshes with ``dcn=``, and what the plan says crosses."""
    out: dict[str, Any] = {}
    for name, mesh in {
        "data_model": meshfeed.make_mesh(data=4, model=2, dcn="data"),
        "model_data": meshfeed.make_mesh(model=2, data=4, dcn={"data": 2}),
        "model_data_plain": meshfeed.make_mesh(model=2, data=4),
    }.items():
        plan = meshfeed.inspect.plan(NamedSharding(mesh, P("data")), (16,), np.float32)
        out[name] = {
            "processes": np.vectorize(lambda d: d.process_index)(mesh.devices),
            "across": plan.across_processes,
            "text": meshfeed.show_plan(plan),
        }
    return out
