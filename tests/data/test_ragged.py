"""Variable-length fields: Ragged, and every source that stores or reads them."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed
import ragged_fns


def _equal(a: meshfeed.Ragged, docs: list[np.ndarray]) -> None:
    assert len(a) == len(docs)
    for got, want in zip(a.to_list(), docs, strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


def test_ragged_indexes_like_a_list_of_arrays():
    docs = ragged_fns.documents()
    r = meshfeed.Ragged.from_list(docs)
    assert len(r) == len(docs) and r.dtype == np.int32
    np.testing.assert_array_equal(r.lengths, [len(d) for d in docs])
    np.testing.assert_array_equal(r[3], docs[3])
    np.testing.assert_array_equal(r[-1], docs[-1])
    _equal(r[2:7], docs[2:7])
    _equal(r[np.array([9, 1, 9])], [docs[9], docs[1], docs[9]])
    pairs = meshfeed.Ragged.from_list([np.zeros((2, 3)), np.ones((1, 3))])
    assert pairs.shape == (2, None, 3) and pairs[1].shape == (1, 3)


@pytest.mark.parametrize(
    ("values", "offsets", "match"),
    [
        (
            np.arange(5),
            [0, 3, 2, 5],
            r"offsets must not decrease, but offsets\[2\]=2 < offsets\[1\]=3",
        ),
        (np.arange(5), [0, 3, 4], r"offsets must run from 0 to len\(values\)=5, got 0 to 4"),
        (np.arange(5), [[0, 5]], "offsets must be a 1-D integer array"),
        (np.float32(3), [0, 1], "at least 1 dimension"),
    ],
)
def test_bad_ragged_input_is_refused(values, offsets, match):
    with pytest.raises(ValueError, match=match):
        meshfeed.Ragged(values, np.asarray(offsets))


def test_array_source_gives_ragged_fields_and_their_lengths():
    docs = ragged_fns.documents()
    src = meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(docs), "id": np.arange(50)})
    assert src.fields["tokens"] == meshfeed.sources.FieldSpec((None,), np.dtype(np.int32))
    got = src[np.array([4, 0])]
    _equal(got["tokens"], [docs[4], docs[0]])
    np.testing.assert_array_equal(src.lengths("tokens"), [len(d) for d in docs])
    with pytest.raises(ValueError, match="not a ragged field"):
        src.lengths("id")


@pytest.mark.parametrize("where", ["local", "memory"])
def test_ragged_fields_round_trip_through_write_and_open(tmp_path, where):
    docs = ragged_fns.documents()
    path = str(tmp_path / "docs") if where == "local" else f"memory://ragged-{id(tmp_path)}"
    meshfeed.write_source(path, {"tokens": docs, "id": np.arange(50)}, shard_size=16)
    src = meshfeed.open_source(path, verify=True)
    assert src.fields["tokens"] == meshfeed.sources.FieldSpec((None,), np.dtype(np.int32))
    np.testing.assert_array_equal(src.lengths("tokens"), [len(d) for d in docs])
    assert src.bytes_read == 8 * (50 + 4)  # the offsets of 4 shards, no value yet
    ids = np.array([40, 3, 17, 3, 16])
    got = src[ids]
    _equal(got["tokens"], [docs[i] for i in ids])
    np.testing.assert_array_equal(got["id"], ids)


def test_records_with_ragged_fields_are_written_a_shard_at_a_time(tmp_path):
    docs = ragged_fns.documents()
    records = ({"tokens": d, "n": np.int64(len(d))} for d in docs)
    meshfeed.write_source(tmp_path / "r", records, shard_size=7, ragged=["tokens"])
    src = meshfeed.open_source(tmp_path / "r")
    _equal(src[np.arange(50)]["tokens"], docs)


@pytest.mark.multiprocess
def test_four_writers_write_parts_that_open_as_one_source(tmp_path):
    path = str(tmp_path / "parts")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.starmap(ragged_fns.write_part, [(path, i, 4) for i in range(3)])
        with pytest.raises(FileNotFoundError, match=r"holds 3 of 4 parts; parts \[3\] are missing"):
            meshfeed.open_source(path)
        pool.starmap(ragged_fns.write_part, [(path, 3, 4)])
    src = meshfeed.open_source(path)
    order = np.concatenate([np.arange(i, 40, 4) for i in range(4)])  # part by part
    docs = ragged_fns.documents(40)
    got = src[np.arange(40)]
    np.testing.assert_array_equal(got["id"], order)
    _equal(got["tokens"], [docs[i] for i in order])


def test_parquet_list_columns_keep_their_value_type(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = ragged_fns.documents()
    table = pa.table({"tokens": pa.array([d.tolist() for d in docs], pa.list_(pa.int32()))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=16)
    src = meshfeed.sources.ParquetSource(str(tmp_path / "t.parquet"))
    assert src.fields["tokens"] == meshfeed.sources.FieldSpec((None,), np.dtype(np.int32))
    np.testing.assert_array_equal(src.lengths("tokens"), [len(d) for d in docs])
    ids = np.array([33, 2, 49, 2])
    _equal(src[ids]["tokens"], [docs[i] for i in ids])


def test_hugging_face_sequences_are_ragged():
    import datasets

    docs = ragged_fns.documents()
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("int32"))})
    ds = datasets.Dataset.from_dict({"tokens": [d.tolist() for d in docs]}, features=features)
    src = meshfeed.sources.HFSource(ds)
    assert src.fields["tokens"] == meshfeed.sources.FieldSpec((None,), np.dtype(np.int32))
    np.testing.assert_array_equal(src.lengths("tokens"), [len(d) for d in docs])
    _equal(src[np.array([7, 0])]["tokens"], [docs[7], docs[0]])


def test_a_record_transform_pads_documents_for_a_2d_sharding():
    docs = ragged_fns.documents()
    mesh = meshfeed.make_mesh(data=4, model=2)
    loader = meshfeed.Loader(
        meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(docs)}),
        global_batch_size=8,
        sharding={
            "tokens": NamedSharding(mesh, P("data", "model")),
            "length": NamedSharding(mesh, P("data")),
        },
        record_transform=ragged_fns.pad,
        last_batch="pad",
        shuffle=False,
    )
    batches = list(loader)
    assert len(batches) == 7 and batches[0]["tokens"].shape == (8, ragged_fns.WIDTH)
    lengths = np.concatenate([np.asarray(b["length"])[np.asarray(b["mask"])] for b in batches])
    np.testing.assert_array_equal(lengths, [min(len(d), ragged_fns.WIDTH) for d in docs])


def test_a_ragged_field_that_reaches_the_devices_says_to_pack_it():
    src = meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(ragged_fns.documents())})
    loader = meshfeed.Loader(
        src, global_batch_size=8, sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=8))
    )
    with pytest.raises(ValueError, match=r"field 'tokens' holds variable-length documents .*pack"):
        next(iter(loader))


def test_a_mixture_of_ragged_sources_tells_its_lengths_and_packs():
    docs = ragged_fns.documents()
    a = meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(docs)})
    b = meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(docs[::-1])})
    both = meshfeed.mix([a, b], weights=[0.5, 0.5])
    got = both[np.arange(len(both))]["tokens"]
    np.testing.assert_array_equal(both.lengths("tokens"), got.lengths)
    packed = meshfeed.pack(both, 16)
    assert packed.stats()["tokens"] == got.lengths.sum()
