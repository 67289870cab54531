"""The catalogue of bad input: each case fails with its exact message, before any thread
starts or array is built, and leaves nothing behind (no thread, no shared memory)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import meshfeed


def _sharding() -> Any:
    return meshfeed.batch_sharding(meshfeed.make_mesh(data=8))


def _source(n: int = 64) -> meshfeed.ArraySource:
    return meshfeed.ArraySource(
        {"x": np.zeros((n, 4), np.float32), "y": np.arange(n, dtype=np.int32)}
    )


def _loader(source: Any = None, **kw: Any) -> meshfeed.Loader:
    args: dict[str, Any] = {"global_batch_size": 16, "sharding": _sharding(), **kw}
    return meshfeed.Loader(_source() if source is None else source, **args)


def _keep(record: Any, rng: Any) -> Any:
    return record


def _holds_a_lock() -> Any:
    lock = threading.Lock()

    def fn(record: Any, rng: Any) -> Any:
        with lock:
            return record

    return fn


def _first(**kw: Any) -> Any:
    return next(iter(_loader(**kw)))


def _ragged() -> meshfeed.ArraySource:
    values = np.empty(64, dtype=object)
    for i in range(64):
        values[i] = np.zeros(i % 5 + 1, np.int32)
    return meshfeed.ArraySource({"tokens": values})


def _truncated(tmp: str) -> Any:
    np.save(f"{tmp}/t.npy", np.zeros((10, 4)))
    with open(f"{tmp}/t.npy", "r+b") as f:
        f.truncate(200)
    return meshfeed.open_source(f"{tmp}/t.npy")


def _not_npy(tmp: str) -> Any:
    with open(f"{tmp}/c.npy", "wb") as f:
        f.write(b"not numpy at all")
    return meshfeed.open_source(f"{tmp}/c.npy")


def _documents(**extra: Any) -> meshfeed.ArraySource:
    docs = meshfeed.Ragged.from_list([np.arange(3), np.arange(40), np.arange(2)])
    return meshfeed.ArraySource({"tokens": docs, **extra})


def _without_initialize(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MESHFEED_NUM_PROCESSES", "2")
    return _loader()


# (case, call(tmp, port, monkeypatch), exception, exact message with {tmp} and {port})
CASES: list[tuple[str, Callable[..., Any], type[BaseException], str]] = [
    (
        "source is a list",
        lambda t, p, m: meshfeed.Loader([1, 2], global_batch_size=8, sharding=_sharding()),  # type: ignore[arg-type]
        TypeError,
        "source is a list, not a meshfeed.Source; wrap arrays in meshfeed.ArraySource({'x': "
        "x, 'y': y}), or give it __len__, __getitem__(ids) and fields.",
    ),
    (
        "global_batch_size a string",
        lambda t, p, m: _loader(global_batch_size="16"),
        TypeError,
        "global_batch_size='16' must be an int, or a list of (start_step, size) stages, "
        "e.g. [(0, 32), (1000, 64)].",
    ),
    (
        "global_batch_size stages out of order",
        lambda t, p, m: _loader(global_batch_size=[(0, 16), (0, 32)]),
        ValueError,
        "global_batch_size[1] starts at step 0, not after the stage before it (step 0); "
        "list stages in the order they start.",
    ),
    (
        "global_batch_size zero",
        lambda t, p, m: _loader(global_batch_size=0),
        ValueError,
        "global_batch_size=0 must be >= 1.",
    ),
    (
        "unknown strategy",
        lambda t, p, m: _loader(strategy="fast"),
        ValueError,
        "strategy='fast' is unknown; pass one of ['global', 'per_device', 'per_process', "
        "'reshard', 'auto'].",
    ),
    (
        "unknown last_batch",
        lambda t, p, m: _loader(last_batch="keep"),
        ValueError,
        "last_batch='keep' is unknown; pass 'drop' or 'pad'.",
    ),
    ("negative seed", lambda t, p, m: _loader(seed=-1), ValueError, "seed=-1 must be an int >= 0."),
    (
        "zero epochs",
        lambda t, p, m: _loader(num_epochs=0),
        ValueError,
        "num_epochs=0 must be an int >= 1, or None for endless.",
    ),
    (
        "negative prefetch",
        lambda t, p, m: _loader(prefetch=-1),
        ValueError,
        "prefetch=-1 must be 'auto' (read-ahead that adapts) or an int >= 0 (steps read "
        "ahead; 0 reads each batch on demand).",
    ),
    (
        "prefetch a word other than auto",
        lambda t, p, m: _loader(prefetch="fast"),
        ValueError,
        "prefetch='fast' must be 'auto' (read-ahead that adapts) or an int >= 0 (steps read "
        "ahead; 0 reads each batch on demand).",
    ),
    (
        "prefetch_bytes zero",
        lambda t, p, m: _loader(prefetch_bytes=0),
        ValueError,
        "prefetch_bytes=0 must be an int >= 1 (the most bytes of batches read ahead).",
    ),
    (
        "an unknown worker_type",
        lambda t, p, m: _loader(record_transform=_keep, num_workers=2, worker_type="fork"),
        ValueError,
        "worker_type='fork' is unknown; pass 'processes', 'threads', 'ray' or "
        "meshfeed.types.RayOptions(...).",
    ),
    (
        "check_every zero",
        lambda t, p, m: _loader(check_every=0),
        ValueError,
        "check_every=0 must be an int >= 1 (steps between replica checks), or None for no checks.",
    ),
    (
        "workers without a record_transform",
        lambda t, p, m: _loader(num_workers=2),
        ValueError,
        "num_workers=2 runs record_transform in worker processes, but no record_transform "
        "was given; pass one, or num_workers=0.",
    ),
    (
        "record_transform not callable",
        lambda t, p, m: _loader(record_transform="decode"),
        TypeError,
        "record_transform='decode' must be a function fn(record, rng) -> record.",
    ),
    (
        "record_transform holding a lock, with worker processes",
        lambda t, p, m: _loader(record_transform=_holds_a_lock(), num_workers=1),
        TypeError,
        "record_transform cannot be sent to worker processes: TypeError: {pickle}. Keep what "
        "it captures picklable (no locks, open files or sockets), or pass "
        "worker_type='threads' or num_workers=0.",
    ),
    (
        "sharding a PartitionSpec",
        lambda t, p, m: _loader(sharding=P("data")),
        TypeError,
        "sharding is a PartitionSpec P('data',), which names no mesh; pass "
        "NamedSharding(mesh, P('data',)) or meshfeed.batch_sharding(mesh).",
    ),
    (
        "sharding a string",
        lambda t, p, m: _loader(sharding="data"),
        TypeError,
        "sharding is a str; pass a jax.sharding.NamedSharding (e.g. "
        "meshfeed.batch_sharding(mesh)) or a mapping field -> NamedSharding.",
    ),
    (
        "sharding an empty mapping",
        lambda t, p, m: _loader(sharding={}),
        ValueError,
        "sharding is an empty mapping; name a sharding for every field.",
    ),
    (
        "batch not divisible by the devices",
        lambda t, p, m: _loader(global_batch_size=12),
        ValueError,
        "global_batch_size=12 is not divisible by the 8 devices on mesh axes ('data',) "
        "(field 'x'); pass a multiple of 8, or a mesh with fewer ('data',) devices.",
    ),
    (
        "empty source",
        lambda t, p, m: _loader(source=_source(0)),
        ValueError,
        "source has 0 examples; pass a source with at least global_batch_size examples.",
    ),
    (
        "batch larger than the source",
        lambda t, p, m: _loader(source=_source(8)),
        ValueError,
        "global_batch_size=16 exceeds the 8 examples of the source, so last_batch='drop' "
        "leaves no step; pass a smaller global_batch_size or last_batch='pad'.",
    ),
    (
        "transform that changes the number of rows",
        lambda t, p, m: _first(transform=lambda d: {k: v[:-1] for k, v in d.items()}),
        ValueError,
        "the transform returned field 'x' as (15, 4) for 16 rows; return one numpy row per "
        "example (16 rows).",
    ),
    (
        "ragged (object) field without a transform",
        lambda t, p, m: _first(source=_ragged()),
        ValueError,
        "field 'tokens' holds variable-length values (an object array) and cannot go to "
        "devices; decode or pad it to a fixed shape with record_transform= (per example) "
        "or transform= (per batch).",
    ),
    (
        "ArraySource of nothing",
        lambda t, p, m: meshfeed.ArraySource({}),
        TypeError,
        "ArraySource takes a non-empty mapping of field name to array, e.g. "
        "ArraySource({'image': x, 'label': y}).",
    ),
    (
        "ArraySource with ragged lengths",
        lambda t, p, m: meshfeed.ArraySource({"a": np.zeros(3), "b": np.zeros(4)}),
        ValueError,
        "fields have different lengths {'a': 3, 'b': 4}; every field needs one row per example.",
    ),
    (
        "ArraySource field a list",
        lambda t, p, m: meshfeed.ArraySource({"a": [1, 2, 3]}),  # type: ignore[dict-item]
        TypeError,
        "field 'a' is a list; pass a numpy array, np.memmap or meshfeed.Ragged "
        "(np.asarray(x) for lists of numbers, Ragged.from_list(x) for lists of documents).",
    ),
    (
        "mesh larger than the devices",
        lambda t, p, m: meshfeed.make_mesh(data=16),
        ValueError,
        "mesh axes {'data': 16} hold 16 devices but there are 8; pass sizes whose product is "
        "8, or devices=.",
    ),
    (
        "mesh and sharding that disagree",
        lambda t, p, m: meshfeed.batch_sharding(meshfeed.make_mesh(data=8), "model"),
        ValueError,
        "batch_sharding axes=('model',) names ['model'], not an axis of the mesh "
        "{'data': 8}; pass axes from ('data',).",
    ),
    (
        "missing data set",
        lambda t, p, m: meshfeed.open_source(f"{t}/missing"),
        FileNotFoundError,
        "{tmp}/missing/meshfeed.json does not exist: {tmp}/missing is not a meshfeed "
        "dataset (or its write did not finish). Write one with meshfeed.write_source, or "
        "open a .npy/.npz file.",
    ),
    (
        "truncated file",
        lambda t, p, m: _truncated(t),
        ValueError,
        "{tmp}/t.npy is truncated: its header says 10 rows of 32 bytes (448 bytes in all), "
        "the file has 200.",
    ),
    (
        "corrupt file",
        lambda t, p, m: _not_npy(t),
        ValueError,
        "{tmp}/c.npy is not a .npy array (no NUMPY magic at its start): corrupt?",
    ),
    (
        "ragged records to write",
        lambda t, p, m: meshfeed.write_source(f"{t}/r", [{"a": np.zeros(2)}, {"a": np.zeros(3)}]),
        ValueError,
        "record 1 has fields {a: float64[3]}, the first record {a: float64[2]}; every record "
        "needs the same fields, shapes and dtypes (name variable-length fields in "
        "ragged=[...], or pad them to a fixed size first).",
    ),
    (
        "mixture of sources with other fields",
        lambda t, p, m: meshfeed.mix([_source(), meshfeed.ArraySource({"z": np.zeros(3)})], [1, 1]),
        ValueError,
        "sources[1] has fields {z: float64[]}, sources[0] has {x: float32[4], y: int32[]}; "
        "every source of a mixture needs the same fields, shapes and dtypes.",
    ),
    (
        "Ragged offsets that decrease",
        lambda t, p, m: meshfeed.Ragged(np.arange(5), np.array([0, 3, 2, 5])),
        ValueError,
        "Ragged offsets must not decrease, but offsets[2]=2 < offsets[1]=3.",
    ),
    (
        "pack a field of 2-D documents",
        lambda t, p, m: meshfeed.pack(
            meshfeed.ArraySource(
                {"tokens": meshfeed.Ragged.from_list([np.zeros((2, 3)), np.zeros((1, 3))])}
            ),
            8,
        ),
        ValueError,
        "pack packs 1-D documents, but field 'tokens' has documents of float64[*, 3] (2-D "
        "values); flatten them.",
    ),
    (
        "pack with seq_len 0",
        lambda t, p, m: meshfeed.pack(_documents(), 0),
        ValueError,
        "seq_len=0 must be an int >= 1 (tokens per packed row).",
    ),
    (
        "pack a field the source lacks",
        lambda t, p, m: meshfeed.pack(_documents(), 8, field="text"),
        ValueError,
        "pack(field='text'): the source has no such field; its fields are ['tokens']. Pass "
        "field= naming the token field, one of ['tokens'].",
    ),
    (
        "pack a source with a fixed-shape field",
        lambda t, p, m: meshfeed.pack(_documents(label=np.arange(3)), 8),
        ValueError,
        "pack packs documents of any length, but field 'label' has a fixed shape (int64[]). A "
        "packed row holds several documents, so a per-document value has no place in it: "
        "give it one value per token (a ragged field aligned with 'tokens'), or leave it "
        "out: pack(..., alongside=[...]) without 'label'.",
    ),
    (
        "pack a document longer than seq_len with long_docs='error'",
        lambda t, p, m: meshfeed.pack(_documents(), 8, long_docs="error"),
        ValueError,
        "document 1 has 40 tokens, more than seq_len=8, and long_docs='error'; pass "
        "long_docs='split' (cut it into pieces), 'truncate' or 'drop', or a larger seq_len.",
    ),
    (
        "launcher port in use",
        lambda t, p, m: meshfeed.launch(["true"], port=p),
        OSError,
        "port {port} on 127.0.0.1 is in use; pass another port, or none to let meshfeed "
        "pick a free one.",
    ),
    (
        "processes started together but not initialised",
        lambda t, p, m: _without_initialize(m),
        RuntimeError,
        "this process was started as one of 2 (by meshfeed launch or run_in_processes) but "
        "jax.distributed is not initialised, so it sees only its own devices; call "
        "meshfeed.initialize() before building meshes or loaders.",
    ),
]


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.fixture
def busy_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_the_catalogue_has_at_least_25_cases():
    assert len(CASES) >= 25


@pytest.mark.parametrize(("case", "call", "error", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_with_its_message_and_leaves_nothing(
    tmp_path, busy_port, monkeypatch, case, call, error, message
):
    threads, shm = {t.ident for t in threading.enumerate()}, _shm()
    with pytest.raises(error) as caught:
        call(str(tmp_path), busy_port, monkeypatch)
    want = message.replace("{tmp}", str(tmp_path)).replace("{port}", str(busy_port))
    if "{pickle}" in message:  # the pickle error's own wording varies by Python version
        prefix, suffix = message.split("{pickle}")
        assert str(caught.value).startswith(prefix) and str(caught.value).endswith(suffix)
    else:
        assert str(caught.value) == want
    left = [t.name for t in threading.enumerate() if t.ident not in threads and t.is_alive()]
    assert not left, f"{case} left threads {left}"
    assert _shm() == shm
