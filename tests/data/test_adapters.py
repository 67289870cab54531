"""Every adapter: the data round-trips through a Loader on 2 processes x 4 devices with
"per_process", each process asking only for its own ids; variable-length values come
back as object arrays."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import meshfeed
from meshfeed.testing import run_in_processes
from source_fns import N, build_source, original, round_trips, write

KINDS = ["parquet", "arrayrecord", "hf", "grain", "torch"]
SUFFIX = {"parquet": "data.parquet", "arrayrecord": "data.array_record", "hf": "hf"}


def _where(tmp_path, kind: str) -> str:
    where = str(tmp_path / SUFFIX.get(kind, "unused"))
    write(kind, where)
    return where


@pytest.mark.parametrize("kind", KINDS)
def test_reads_the_original_values(tmp_path, kind):
    source = build_source(kind, _where(tmp_path, kind))
    assert len(source) == N
    assert source.fields["image"] == meshfeed.sources.FieldSpec((4, 4), np.dtype(np.uint8))
    assert source.fields["tokens"] == meshfeed.sources.FieldSpec((6,), np.dtype(np.int32))
    ids = np.array([95, 3, 3, 40, 0])
    got = source[ids]
    for name, array in original().items():
        np.testing.assert_array_equal(got[name], array[ids])


@pytest.mark.multiprocess
def test_two_processes_each_read_only_their_ids(tmp_path):
    kinds = [*KINDS, "mix"]  # every adapter in the same two processes, one after another
    for kind in kinds:
        (tmp_path / kind).mkdir()
    where = {kind: _where(tmp_path / kind, kind) for kind in kinds}
    results = run_in_processes(round_trips, where, num_processes=2, devices_per_process=4)
    for kind in kinds:
        for result in (results[0][kind], results[1][kind]):
            assert result["mismatches"] == 0, kind
            assert result["asked"] == result["needed"], kind
        both = results[0][kind]["asked"] + results[1][kind]["asked"]
        assert sorted(both) == list(range(N)), kind


def test_parquet_reads_only_row_groups_with_requested_ids(tmp_path):
    where = _where(tmp_path, "parquet")  # row groups of 20
    source = meshfeed.sources.ParquetSource(where)
    source[np.array([0, 5, 19, 61])]
    assert source.row_groups_read == 2
    source[np.array([1, 62, 95])]  # two cached, one new
    assert source.row_groups_read == 3
    uncached = meshfeed.sources.ParquetSource(where, cache_bytes=0)
    uncached[np.array([0, 61])]
    uncached[np.array([1, 62])]
    assert uncached.row_groups_read == 4


def test_variable_length_lists_are_ragged_and_bytes_object_arrays(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tokens = [list(range(n)) for n in (3, 1, 4, 2)]
    blobs = [b"a", b"bcd", b"", b"ef"]
    pq.write_table(pa.table({"tokens": tokens, "blob": blobs}), tmp_path / "v.parquet")
    source = meshfeed.sources.ParquetSource(str(tmp_path / "v.parquet"))
    assert source.fields["tokens"] == meshfeed.sources.FieldSpec((None,), np.dtype(np.int64))
    got = source[np.array([2, 0])]
    assert isinstance(got["tokens"], meshfeed.Ragged)
    np.testing.assert_array_equal(got["tokens"][0], [0, 1, 2, 3])
    np.testing.assert_array_equal(source.lengths("tokens"), [3, 1, 4, 2])
    assert got["blob"].tolist() == [b"", b"a"]

    mesh = meshfeed.make_mesh(data=2, devices=jax.devices()[:2])
    loader = meshfeed.Loader(
        source, global_batch_size=2, sharding=meshfeed.batch_sharding(mesh), prefetch=0
    )
    with pytest.raises(ValueError, match=r"field 'tokens' holds variable-length documents"):
        next(iter(loader))


def test_changing_shapes_name_the_example():
    import grain

    ds = grain.MapDataset.source([{"x": np.zeros(3)}, {"x": np.zeros(2)}])
    with pytest.raises(ValueError, match=r"field 'x' of example 1 .* pass variable=\['x'\]"):
        meshfeed.sources.GrainSource(ds)[np.array([0, 1])]
    as_objects = meshfeed.sources.GrainSource(ds, variable=["x"])[np.array([1])]
    assert as_objects["x"][0].shape == (2,)


def test_hf_refuses_an_iterable_dataset():
    import datasets

    iterable = datasets.Dataset.from_dict({"a": [1, 2]}).to_iterable_dataset()
    with pytest.raises(TypeError, match=r"HFSource takes a datasets\.Dataset"):
        meshfeed.sources.HFSource(iterable)


@pytest.mark.parametrize(
    ("make", "module", "extra"),
    [
        (lambda: meshfeed.sources.ParquetSource("x.parquet"), "pyarrow", "parquet"),
        (lambda: meshfeed.sources.HFSource(None), "datasets", "hf"),
        (lambda: meshfeed.sources.ArrayRecordSource("x", None), "array_record", "arrayrecord"),
    ],
)
def test_a_missing_library_names_the_extra(monkeypatch, make, module, extra):
    import sys

    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=rf"pip install 'meshfeed\[{extra}\]'"):
        make()
