"""Files as other tools write them: every value as the file holds it (a null is never a
number, nested values are Python values), and every file that cannot be read named --
through a loader with no workers, worker processes and threads alike."""

from __future__ import annotations

import base64
import json
import os

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import meshfeed
from meshfeed.sources import BadFileError, HFSource, JsonlSource, ParquetSource

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float16", "float32", "float64"]
N = 12
NULLS = [1, 4, 5, 11]  # rows holding a null


def _extremes(name: str) -> list:
    """Values at the ends of the type's range, which a detour through float64 would move."""
    info = np.iinfo(name)
    return [int(info.min), int(info.max), int(info.max) - 1, int(info.min) + 1]


def _numbers_table() -> pa.Table:
    columns = {}
    for name in INTS:
        values = [(_extremes(name) * N)[i] for i in range(N)]
        columns[name] = pa.array([None if i in NULLS else v for i, v in enumerate(values)], name)
    for name in FLOATS:
        columns[name] = pa.array(
            [None if i in NULLS else i / 4 for i in range(N)], pa.from_numpy_dtype(np.dtype(name))
        )
    columns["bool"] = pa.array([None if i in NULLS else i % 3 == 0 for i in range(N)])
    columns["tokens"] = pa.array(
        [None if i == 2 else [None, i] if i in NULLS else [i, i + 1, i + 2] for i in range(N)],
        pa.list_(pa.int32()),
    )
    return pa.table(columns)


def _want(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist()


def test_a_null_is_never_read_as_a_number_from_parquet_datasets_or_json_lines(tmp_path):
    table = _numbers_table()
    pq.write_table(table, tmp_path / "stats.parquet", row_group_size=5)
    pq.write_table(table, tmp_path / "plain.parquet", row_group_size=5, write_statistics=False)
    datasets = pytest.importorskip("datasets")
    with open(tmp_path / "rows.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in table.to_pylist())
    every = np.arange(N)
    ints = [*INTS, "bool"]
    fill: dict[str, int | float | bool] = {n: False if n == "bool" else 7 for n in ints}
    fill["tokens"] = -1
    for name in FLOATS:
        fill[name] = 0.5
    sources = {
        "parquet": lambda **kw: ParquetSource(str(tmp_path / "stats.parquet"), **kw),
        "parquet without statistics": lambda **kw: ParquetSource(
            str(tmp_path / "plain.parquet"), **kw
        ),
        "datasets": lambda **kw: HFSource(datasets.Dataset(table), **kw),
        "json lines": lambda **kw: JsonlSource(
            str(tmp_path / "rows.jsonl"),
            build=True,
            fields={n: "ragged:int32" if n == "tokens" else n for n in table.column_names},
            **kw,
        ),
    }
    for kind, make in sources.items():
        # Integers and booleans: refused, by field, with the two ways to read them; at
        # open where the file counts its nulls, else at the read of a row holding one.
        for name in [*ints, "tokens"]:
            refusal = rf"field '{name}' \({'int32' if name == 'tokens' else name}\) holds"
            refusal += rf".*fill=\{{'{name}': (0|False)\}}.*'{name}_valid'"
            at_open = kind == "datasets" or (kind == "parquet" and name != "tokens")
            with pytest.raises(ValueError, match=refusal):
                source = make(fill={n: v for n, v in fill.items() if n != name})
                assert not at_open, (kind, name)
                source[every]
            good = np.setdiff1d(every, [*NULLS, 2])
            if not at_open:  # rows without a null read as they are
                got = make(fill={n: v for n, v in fill.items() if n != name})[good][name]
                got = got.to_list() if isinstance(got, meshfeed.Ragged) else got
                assert [np.asarray(g).tolist() for g in got] == [
                    _want(table, name)[i] for i in good
                ]
        # Filled: the fill where the file holds a null, every other value exactly, and
        # <name>_valid saying which is which; floats without fill hold NaN.
        source = make(fill=fill)
        got = source[every]
        for name in [*ints, *FLOATS]:
            want = _want(table, name)
            assert got[name].dtype == np.dtype(name)
            held = np.array([v is not None for v in want])
            np.testing.assert_array_equal(got[f"{name}_valid"], held, err_msg=f"{kind} {name}")
            expected = [fill[name] if v is None else v for v in want]
            assert got[name].tolist() == expected, (kind, name)
        tokens, valid = got["tokens"], got["tokens_valid"]
        for i, want in enumerate(_want(table, "tokens")):
            want = want or []  # a null list: an empty document
            assert tokens[i].tolist() == [-1 if v is None else v for v in want], (kind, i)
            assert valid[i].tolist() == [v is not None for v in want], (kind, i)
        floats = make(fill={n: v for n, v in fill.items() if n not in FLOATS})[every]
        for name in FLOATS:
            assert "{name}_valid" not in floats
            np.testing.assert_array_equal(np.isnan(floats[name]), np.isin(every, NULLS))


def test_a_filled_field_is_checked_against_the_column(tmp_path):
    pq.write_table(_numbers_table(), tmp_path / "n.parquet")
    path = str(tmp_path / "n.parquet")
    with pytest.raises(ValueError, match=r"fill\['int8'\]=300 does not fit field 'int8' \(int8\)"):
        ParquetSource(path, columns=["int8"], fill={"int8": 300})
    with pytest.raises(ValueError, match=r"fill\['bool'\]=1 does not fit field 'bool' \(bool\)"):
        ParquetSource(path, columns=["bool"], fill={"bool": 1})
    with pytest.raises(ValueError, match=r"fill names 'age', not a field of .*n.parquet"):
        ParquetSource(path, columns=["int8"], fill={"age": 0})
    with pytest.raises(TypeError, match=r"fill=\['int8'\] must be a dict of field -> value"):
        ParquetSource(path, columns=["int8"], fill=["int8"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fill\['int8'\]='0' must be a number or a bool"):
        ParquetSource(path, columns=["int8"], fill={"int8": "0"})  # type: ignore[dict-item]
    pq.write_table(
        pa.table({"a": [1, None], "a_valid": [1, 2], "s": ["x", None]}), tmp_path / "c.parquet"
    )
    with pytest.raises(ValueError, match=r"has a field 'a_valid' already"):
        ParquetSource(str(tmp_path / "c.parquet"), fill={"a": 0})
    with pytest.raises(ValueError, match=r"fill names 's', which holds objects"):
        ParquetSource(str(tmp_path / "c.parquet"), columns=["s"], fill={"s": 0})


def _nested_table() -> pa.Table:
    address = pa.struct([("city", pa.string()), ("zips", pa.list_(pa.int32()))])
    return pa.table({
        "id": pa.array(range(6), pa.int64()),
        "matrix": pa.array([[[1], [2, 3]], [], None, [[4, None]], [[]], [[5]]]),
        "tags": pa.array([[("a", 1)], [], None, [("b", 2), ("c", None)], [], [("d", 4)]],
                         pa.map_(pa.string(), pa.int64())),
        "person": pa.array([{"name": "x", "address": {"city": "p", "zips": [1, 2]}}, None,
                            {"name": None, "address": None}, {"name": "y", "address":
                            {"city": None, "zips": None}}, {"name": "z", "address": None},
                            {"name": "w", "address": {"city": "q", "zips": []}}],
                           pa.struct([("name", pa.string()), ("address", address)])),
        "born": pa.array([{"day": d} for d in (0, 1, 2, 2932896 * 100, 4, 5)],
                         pa.struct([("day", pa.date32())])),
    })  # fmt: skip


def _loader(source, batch: int = 2, **kw) -> meshfeed.Loader:
    mesh = meshfeed.make_mesh(data=2, devices=jax.devices()[:2])
    return meshfeed.Loader(
        source, global_batch_size=batch, sharding=meshfeed.batch_sharding(mesh),
        shuffle=False, prefetch=0, **kw,
    )  # fmt: skip


def _keep(record, rng):
    return {"id": np.asarray(record["id"])}


def test_nested_columns_read_as_python_values_and_a_value_python_cannot_hold_is_named(tmp_path):
    table = _nested_table()
    path = str(tmp_path / "nested.parquet")
    pq.write_table(table, path, row_group_size=3)
    datasets = pytest.importorskip("datasets")
    readable = np.array([0, 1, 2, 4, 5])  # row 3 holds a date past year 9999
    hf = datasets.Dataset(table.drop_columns(["tags"]))  # datasets has no map type
    for source in (ParquetSource(path), HFSource(hf)):
        got = source[readable]
        for name in [n for n in ("matrix", "tags", "person") if n in source.fields]:
            assert got[name].dtype == object
            assert list(got[name]) == [table.column(name)[int(i)].as_py() for i in readable]
        with pytest.raises(ValueError, match=r"OverflowError: date value out of range") as caught:
            source[np.array([3])]
        assert isinstance(caught.value.__cause__, OverflowError)
    with pytest.raises(BadFileError, match=rf"{path}, row group 1, column 'born': Overflow"):
        ParquetSource(path)[np.array([5, 3])]
    # A loader skips the one row (the next test goes through workers); raises naming the
    # file otherwise.
    source = ParquetSource(path, columns=["id", "born"])
    loader = _loader(source, on_error="skip", record_transform=_keep)
    assert np.concatenate([b["id"][b["mask"]] for b in loader]).tolist() == [0, 1, 2, 4, 5]
    with pytest.raises(BadFileError, match=rf"{path}, row group 1, column 'born'"):
        list(_loader(source, record_transform=_keep))


class _Kms:
    """An in-memory key service, as pyarrow's own encryption tests write one."""

    @staticmethod
    def factory():
        import pyarrow.parquet.encryption as pe

        class Client(pe.KmsClient):
            def __init__(self, config):
                super().__init__()
                self.keys = config.custom_kms_conf

            def wrap_key(self, key_bytes, master_key_identifier):
                return base64.b64encode(self.keys[master_key_identifier].encode() + key_bytes)

            def unwrap_key(self, wrapped_key, master_key_identifier):
                return base64.b64decode(wrapped_key)[len(self.keys[master_key_identifier]) :]

        return pe.CryptoFactory(lambda config: Client(config)), pe.KmsConnectionConfig(
            custom_kms_conf={"footer": "0123456789012345", "col": "1234567890123450"}
        )


def _write_encrypted(path, plaintext_footer: bool) -> None:
    import pyarrow.parquet.encryption as pe

    factory, connection = _Kms.factory()
    config = pe.EncryptionConfiguration(
        footer_key="footer", column_keys={"col": ["secret"]},
        plaintext_footer=plaintext_footer, double_wrapping=False,
    )  # fmt: skip
    table = pa.table({"pairs": [[i, i + 1] for i in range(10)], "secret": np.arange(10.0)})
    properties = factory.file_encryption_properties(connection, config)
    with pq.ParquetWriter(path, table.schema, encryption_properties=properties) as writer:
        writer.write_table(table)


@pytest.mark.parametrize("plaintext_footer", [True, False], ids=["plaintext footer", "encrypted"])
def test_an_encrypted_parquet_file_is_refused_by_name(tmp_path, plaintext_footer):
    # With a plaintext footer, pyarrow aborts the process on the first look at an
    # encrypted column's metadata; meshfeed refuses the file before that look.
    path = str(tmp_path / "secret.parquet")
    _write_encrypted(path, plaintext_footer)
    refusal = rf"{path} is encrypted \(Parquet modular encryption\).*write a decrypted copy"
    with pytest.raises(BadFileError, match=refusal):
        ParquetSource(path)
    with pytest.raises(BadFileError, match=refusal):
        meshfeed.index(path)


def _data_page(path: str, group: int) -> int:
    return pq.ParquetFile(path).metadata.row_group(group).column(0).data_page_offset


def test_a_damaged_parquet_file_is_named_with_its_row_group(tmp_path):
    table = pa.table({"id": np.arange(40), "text": [f"row {i}" for i in range(40)]})
    good, cut, bad = (str(tmp_path / f"{n}.parquet") for n in ("good", "cut", "bad"))
    pq.write_table(table, good, row_group_size=10)
    with open(good, "rb") as f:
        data = f.read()
    with open(cut, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(BadFileError, match=rf"{cut}, its footer: ArrowInvalid") as caught:
        ParquetSource([good, cut])
    assert caught.value.__cause__ is not None
    with pytest.raises(BadFileError, match=rf"{cut}, its footer"):
        meshfeed.index(cut)
    # A page header written over, in row group 2: the file opens, that group does not.
    damaged = bytearray(data)
    at = _data_page(good, 2)
    damaged[at : at + 16] = b"\xff" * 16
    with open(bad, "wb") as f:
        f.write(damaged)
    source = ParquetSource(bad, columns=["id"])
    np.testing.assert_array_equal(source[np.array([0, 39])]["id"], [0, 39])
    with pytest.raises(BadFileError, match=rf"{bad}, row group 2: OSError"):
        source[np.array([25])]
    for workers, kind in ((0, "processes"), (2, "processes"), (2, "threads")):
        options = {"num_workers": workers, "worker_type": kind, "record_transform": _keep}
        loader = _loader(source, 8, on_error="skip", **options)
        kept = np.concatenate([b["id"][b["mask"]] for b in loader]).tolist()
        assert kept == [*range(20), *range(30, 40)], (workers, kind)
        assert [s.example for s in loader.skipped] == list(range(20, 30))
    with pytest.raises(BadFileError, match=rf"{bad}, row group 2"):
        list(_loader(source, 8, **options))  # 2 threads
    assert os.path.getsize(bad) == len(data)
