"""Damaged files for every reader (issue 71, "no input kills the process"): the files, the
mutations, the peers' readings and the child process that counts the outcomes.

Each format's files are written by its peer's own writer -- pyarrow's
``write_table``, webdataset's ``TarWriter``, ``json.dumps`` a line, the ``tfrecord``
package's ``TFRecordWriter``, ``meshfeed.write_source``, Pillow -- and each is damaged
``MUTATIONS`` times, seeded by (format, file, mutation), before meshfeed or the peer
sees it: cut at a random byte, 1-8 random bits flipped, or a range of up to 256 bytes
zeroed. The damaged copy sits in a folder of its own (no index, catalog or open file
of another copy can be taken for it), and both the peer (the *oracle*) and meshfeed
read those same bytes.

The oracles, one per format, read every row as the peer does:

- Parquet: ``pyarrow.parquet.read_table``, as Python values (``None`` for a null).
- WebDataset tar: webdataset's ``tar_file_iterator`` and ``group_by_keys`` (Python's
  ``tarfile``, streamed): a sample per key, its members' bytes -- for odd files decoded
  by webdataset's own decoders (``txt``, ``cls``, ``json``, ``npy``).
- JSON Lines: the text split at ``\\n``, empty lines left out, each line decoded as
  UTF-8 (what JSON Lines specifies) and ``json.loads``-ed.
- TFRecord: the ``tfrecord`` package's ``tfrecord_iterator`` (which reads lengths and
  data without checking a CRC) and its ``Example`` message, every feature as its list.
- meshfeed folder: ``json.loads`` of the manifest for the shards' files, then
  ``numpy.load`` of each (a ragged field's offsets must run from 0 up to its values'
  length); rows are the files' rows in the manifest's order.
- Images: ``PIL.Image.open(path).convert("RGB")``.

meshfeed reads each copy as a user would: the index or catalog built after the damage
(``meshfeed.index`` for even files, ``build=True`` or no catalog for odd ones), then
every row in one read: ``ParquetSource``; ``TarSource`` (bytes for even files,
``decode=TAR_DECODE`` for odd ones); ``JsonlSource`` (typed from the first record for
even files, by explicit ``fields=`` for odd ones); ``TFRecordSource(decode="example")``
(likewise, and ``check_crc=False`` for files 1 and 2 of every 4, so that damaged data
reaches the Example parser); ``open_source``; and ``ImageFolderSource(files=...)`` in a
``Loader`` whose record transform is ``meshfeed.vision.decode`` (the decode knows bytes,
not files: the loader is what can name the file).

Each (file, mutation) has one outcome:

- **equal**: meshfeed read every row, and its rows are the oracle's: the same count,
  the same fields, each value equal, strictly -- a bool is not a number, a float is
  never read as an int (a JSON integer read into a float field counts where exact), a
  null only as a null (``None``: never NaN, 0 or a sentinel), NaN equals NaN, arrays of
  the same kind (bool, int, float, bytes, str) and shape. A field a record lacks (a JSON
  Lines record, a TFRecord feature) is equal to nothing: meshfeed must refuse it.
- **refused**: meshfeed raised an exception (an ``Exception``) whose message holds the
  damaged file's path or name (in a folder: the damaged file's path in the folder,
  ``x/00001.npy`` or ``meshfeed.json``; naming the folder alone is not enough), whatever
  the oracle did -- the peer may have read rows from it or refused it.
- **as written**: the oracle refused the copy, but meshfeed read rows, and they are
  exactly the rows the file held before the damage. The damage fell in bytes meshfeed
  does not read, or reads through something that holds them as written (a header field
  it takes from its manifest or index): no value the file does not hold reaches the
  user, and refusing would need meshfeed to read and check every byte the peer does,
  which the issue does not ask. Accepted, but counted apart, and listed by the child,
  so that a reader that ignores damage it could see stays visible.
- **other**: anything else, and the test fails on it: rows that differ from the
  oracle's (also when they are the rows as written: where the peer reads the bytes as
  other values, meshfeed's are not the file's); rows where the oracle refused that are
  not the rows as written; an error that does not name the file; an exception that is
  not an ``Exception``; a hang (past ``SOFT_S`` in Python: an alarm; past ``HARD_S``
  anywhere: faulthandler's watchdog ends the child); a crash.

The child (``main``) runs one format's mutations and prints a JSON line as each starts
and as it ends, then one line of counts; a child that dies mid-mutation is restarted by
the parent after it (``test_fuzz.py``), that mutation counted as *other*.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import importlib.util
import itertools
import json
import math
import os
import re
import resource
import shutil
import signal
import struct
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("parquet", "tar", "jsonl", "tfrecord", "folder", "images")
MUTATIONS = 50
"""Mutations of each file."""
SEEDS = {fmt: 7100 + k for k, fmt in enumerate(FORMATS)}
SOFT_S = 10.0
"""A mutation's time in Python before the alarm calls it a hang."""
HARD_S = 30
"""A mutation's time before faulthandler's watchdog dumps every thread and ends the child."""
MEMORY_BYTES = 4 << 30
"""Address space the child may add after its imports: a huge allocation is a MemoryError
(an outcome), not the machine's OOM killer."""


class Hung(BaseException):
    """A read past ``SOFT_S`` (a ``BaseException``, so that no reader's handler keeps it)."""


class Missing:
    """A value the oracle's row lacks (a field absent from a record): equal to nothing."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = Missing()


# -- the files, as the peers write them --------------------------------------------------


def write_parquet(folder: Path, j: int) -> Path:
    """40 rows, 7 columns, row groups of 16; compression, dictionary and page version
    varied by file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng([11, j])
    n = 40
    f64 = rng.normal(size=n) * 1e3
    f64[[3, 17]] = [math.nan, math.inf]
    words = ["", "a", "zebra", "naïve", "日本", "x" * 30]
    table = pa.table(
        {
            "i32": pa.array(rng.integers(-(2**31), 2**31, n), pa.int32()),
            "i64": pa.array(rng.integers(-(2**62), 2**62, n), pa.int64()),
            "f64": pa.array(f64, pa.float64()),
            "f32": pa.array(rng.normal(size=n).astype(np.float32), pa.float32()),
            "flag": pa.array(rng.random(n) < 0.5, pa.bool_()),
            "text": pa.array([words[i % len(words)] + str(i) for i in range(n)], pa.string()),
            "tokens": pa.array(
                [rng.integers(0, 1000, int(rng.integers(0, 6))).tolist() for _ in range(n)],
                pa.list_(pa.int32()),
            ),
        }
    )
    path = folder / f"fuzz-{j}.parquet"
    pq.write_table(
        table,
        path,
        row_group_size=16,
        compression=("none", "snappy", "zstd", "gzip")[j % 4],
        use_dictionary=j % 2 == 0,
        data_page_version=("1.0", "2.0")[(j // 2) % 2],
    )
    return path


def write_tar(folder: Path, j: int) -> Path:
    """6 samples of ``txt``, ``cls``, ``json``, ``npy`` and ``bin``; odd files with a
    fractional mtime and a key over 100 bytes (pax headers), even ones plain ustar."""
    from webdataset.writer import TarWriter

    rng = np.random.default_rng([12, j])
    path = folder / f"fuzz-{j}.tar"
    mtime = 1_700_000_000 + (0.5 if j % 2 else 0)
    with TarWriter(str(path), mtime=mtime) as sink:
        for i in range(6):
            key = f"s{j:03d}-{i:04d}" + ("-" + "k" * 100 if j % 2 and i == 2 else "")
            sink.write({
                "__key__": key,
                "txt": f"text of sample {i} " + "é" * i,
                "cls": str(int(rng.integers(0, 10))),
                "json": {"i": i, "even": i % 2 == 0},
                "npy": rng.integers(-500, 500, (2, i + 1)).astype(np.int16),
                "bin": rng.integers(0, 256, int(rng.integers(1, 200)), np.uint8).tobytes(),
            })  # fmt: skip
    return path


JSONL_FIELDS = {"id": "int64", "text": "str", "score": "float64", "flag": "bool",
                "tokens": "ragged:int64"}  # fmt: skip


def write_jsonl(folder: Path, j: int) -> Path:
    """24 records: an int, a string (escapes, non-ASCII), a float, a bool, a list of ints."""
    rng = np.random.default_rng([13, j])
    lines = []
    for i in range(24):
        record = {
            "id": int(rng.integers(-(2**40), 2**40)),
            "text": ["plain", 'q"uote', "tab\there", "naïve", "日本語", ""][i % 6] + str(i),
            "score": float(rng.normal()) if i else 0.5,
            "flag": bool(rng.random() < 0.5),
            "tokens": rng.integers(0, 50_000, int(rng.integers(1, 6))).tolist(),
        }
        lines.append(json.dumps(record, ensure_ascii=j % 2 == 0))
    path = folder / f"fuzz-{j}.jsonl"
    path.write_bytes(("\n".join(lines) + "\n").encode())
    return path


TFRECORD_FEATURES = {"id": "int64", "score": "float32", "tokens": "ragged:int64",
                     "vec": "ragged:float32", "name": "bytes"}  # fmt: skip


def write_tfrecord(folder: Path, j: int) -> Path:
    """12 ``tf.train.Example`` records: an int, a float, lists of ints and floats (the
    first of 2 or more, so that types read from it are lists), bytes. The package's
    Examples and framing, the features' map in one order (its ``write`` leaves the order
    to the protobuf runtime, which varies it from run to run)."""
    from tfrecord import example_pb2
    from tfrecord.writer import TFRecordWriter

    rng = np.random.default_rng([14, j])
    path = folder / f"fuzz-{j}.tfrecord"
    with open(path, "wb") as out:
        for i in range(12):
            low = 2 if i == 0 else 1
            example = TFRecordWriter.serialize_tf_example({
                "id": (int(rng.integers(-(2**40), 2**40)), "int"),
                "score": (float(np.float32(rng.normal())), "float"),
                "tokens": (rng.integers(0, 50_000, int(rng.integers(low, 7))).tolist(), "int"),
                "vec": (rng.normal(size=int(rng.integers(low, 5))).astype(np.float32).tolist(),
                        "float"),
                "name": (b"rec-%d-" % i + rng.integers(1, 256, 5, np.uint8).tobytes(), "byte"),
            })  # fmt: skip
            record = example_pb2.Example.FromString(example).SerializeToString(deterministic=True)
            length = struct.pack("<Q", len(record))
            out.write(length + TFRecordWriter.masked_crc(length))
            out.write(record + TFRecordWriter.masked_crc(record))
    return path


def write_folder(folder: Path, j: int) -> Path:
    """A meshfeed folder of 20 rows in shards of 8: float32 ``[3]`` (a NaN among them),
    int64, bool and ragged int32 (some documents empty)."""
    import meshfeed

    rng = np.random.default_rng([15, j])
    n = 20
    x = rng.normal(size=(n, 3)).astype(np.float32)
    x[5, 1] = np.nan
    docs = [rng.integers(-1000, 1000, int(rng.integers(0, 5))).astype(np.int32) for _ in range(n)]
    path = folder / f"fuzz-{j}"
    meshfeed.write_source(
        path,
        {"x": x, "y": rng.integers(-(2**62), 2**62, n), "b": rng.random(n) < 0.5,
         "tokens": meshfeed.Ragged.from_list(docs, dtype=np.int32)},
        shard_size=8,
    )  # fmt: skip
    return path


def write_image(folder: Path, j: int) -> Path:
    """A 20 x 14 image: JPEG (RGB; greyscale progressive) or PNG (RGB; palette)."""
    from PIL import Image

    rng = np.random.default_rng([16, j])
    yy, xx = np.mgrid[0:14, 0:20]
    pixels = np.stack([xx * 12, yy * 18, (xx + yy) * 7], -1) + rng.integers(0, 30, (14, 20, 3))
    image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB")
    kind = j % 4
    if kind == 0:
        path = folder / f"fuzz-{j}.jpg"
        image.save(path, "JPEG", quality=90)
    elif kind == 1:
        path = folder / f"fuzz-{j}.png"
        image.save(path, "PNG")
    elif kind == 2:
        path = folder / f"fuzz-{j}.jpeg"
        image.convert("L").save(path, "JPEG", quality=80, progressive=True)
    else:
        path = folder / f"fuzz-{j}.png"
        image.convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save(path, "PNG")
    return path


WRITERS: dict[str, Callable[[Path, int], Path]] = {
    "parquet": write_parquet, "tar": write_tar, "jsonl": write_jsonl,
    "tfrecord": write_tfrecord, "folder": write_folder, "images": write_image,
}  # fmt: skip


# -- the oracles: every row as the peer reads it ------------------------------------------

Rows = list[dict[str, Any]]


def oracle_parquet(path: Path) -> Rows:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def oracle_tar(path: Path) -> Rows:
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    with open(path, "rb") as stream:
        tar: Any = stream  # read as webdataset reads a shard it opened
        files = ({**f, "__url__": str(path)} for f in tar_file_iterator(tar))
        samples = list(group_by_keys(files))
    return [{k: v for k, v in s.items() if k != "__url__"} for s in samples]


def oracle_jsonl(path: Path) -> Rows:
    lines = [line for line in path.read_bytes().split(b"\n") if line]
    return [json.loads(line.decode("utf-8")) for line in lines]


def oracle_tfrecord(path: Path) -> Rows:
    """The package's records, each parsed by its ``Example`` message: a feature's values
    as a list of bytes or an array (its ``tfrecord_loader`` makes a bytes list an array of
    ``S``, which drops trailing NULs; and it refuses a feature of no kind, as here)."""
    from tfrecord import example_pb2
    from tfrecord.reader import tfrecord_iterator

    rows = []
    for record in tfrecord_iterator(str(path)):
        example = example_pb2.Example.FromString(bytes(record))
        row: dict[str, Any] = {}
        for key, feature in example.features.feature.items():
            kind = feature.WhichOneof("kind")
            if kind == "bytes_list":
                row[key] = list(feature.bytes_list.value)
            elif kind == "float_list":
                row[key] = np.array(feature.float_list.value, np.float32)
            elif kind == "int64_list":
                row[key] = np.array(feature.int64_list.value, np.int64)
            else:
                raise ValueError(f"feature {key!r} holds no list")
        rows.append(row)
    return rows


def oracle_folder(path: Path) -> Rows:
    manifest = json.loads((path / "meshfeed.json").read_bytes().decode("utf-8"))
    names = list(manifest["fields"])
    columns: dict[str, list[Any]] = {n: [] for n in names}
    for s, shard in enumerate(manifest["shards"]):
        counts = set()
        for name in names:
            entry = shard["files"][name]
            if "values" in entry:  # a ragged field: values and offsets
                values = np.load(path / entry["values"]["path"], allow_pickle=False)
                offsets = np.load(path / entry["offsets"]["path"], allow_pickle=False)
                if not (
                    offsets.ndim == 1 and offsets.dtype.kind in "iu" and len(offsets)
                    and offsets[0] == 0 and (np.diff(offsets) >= 0).all()
                    and offsets[-1] == len(values)
                ):  # fmt: skip
                    raise ValueError(f"shard {s} of {name}: its offsets do not fit its values")
                rows = [values[a:b] for a, b in itertools.pairwise(offsets)]
            else:
                rows = list(np.load(path / entry["path"], allow_pickle=False))
            counts.add(len(rows))
            columns[name] += rows
        if len(counts) > 1:
            raise ValueError(f"shard {s}: its fields hold {sorted(counts)} rows")
    n = len(columns[names[0]]) if names else 0
    return [{k: columns[k][i] for k in names} for i in range(n)]


def oracle_image(path: Path) -> Rows:
    from PIL import Image

    with Image.open(path) as image:
        return [{"pixels": np.asarray(image.convert("RGB"))}]


ORACLES: dict[str, Callable[[Path], Rows]] = {
    "parquet": oracle_parquet, "tar": oracle_tar, "jsonl": oracle_jsonl,
    "tfrecord": oracle_tfrecord, "folder": oracle_folder, "images": oracle_image,
}  # fmt: skip


# -- meshfeed's reading ----------------------------------------------------------------


def column_rows(column: Any) -> list[Any]:
    """A source's column as one value per row (a ``Ragged``'s documents, an array's rows)."""
    if hasattr(column, "offsets") and hasattr(column, "values"):
        return [column[i] for i in range(len(column))]
    return list(column)


def every_row(source: Any) -> Rows:
    """Every row of ``source``, in one read."""
    columns = source[np.arange(len(source))]
    rows: Rows = [{} for _ in range(len(source))]
    for name, column in columns.items():
        values = column_rows(column)
        if len(values) != len(rows):
            raise AssertionError(f"field {name} holds {len(values)} rows of {len(rows)}")
        for row, value in zip(rows, values, strict=True):
            row[name] = value
    return rows


def read_parquet(path: Path, j: int) -> Rows:
    import meshfeed

    if j % 2 == 0:
        meshfeed.index(str(path), progress=False)  # the catalog: each file's row groups
    return every_row(meshfeed.sources.ParquetSource(str(path)))


TAR_DECODE = {"txt": "text", "cls": "int", "json": "json", "npy": "npy"}
"""What odd tar files are decoded with (even ones are read as bytes)."""


def read_tar(path: Path, j: int) -> Rows:
    import meshfeed

    if j % 2 == 0:
        meshfeed.index(str(path), progress=False)
        return every_row(meshfeed.sources.TarSource(str(path)))
    return every_row(meshfeed.sources.TarSource(str(path), decode=TAR_DECODE, build=True))


def read_jsonl(path: Path, j: int) -> Rows:
    import meshfeed

    if j % 2 == 0:  # typed from the first record
        meshfeed.index(str(path), progress=False)
        return every_row(meshfeed.sources.JsonlSource(str(path)))
    return every_row(meshfeed.sources.JsonlSource(str(path), fields=JSONL_FIELDS, build=True))


def read_tfrecord(path: Path, j: int) -> Rows:
    import meshfeed

    check = j % 4 in (0, 3)  # unchecked, the damaged data reaches the Example parser
    if j % 2 == 0:
        meshfeed.index(str(path), progress=False)
        source = meshfeed.sources.TFRecordSource(str(path), decode="example", check_crc=check)
    else:
        source = meshfeed.sources.TFRecordSource(
            str(path), decode="example", features=TFRECORD_FEATURES, check_crc=check, build=True
        )
    return every_row(source)


def read_folder(path: Path, j: int) -> Rows:
    import meshfeed

    if j % 2 == 0:
        meshfeed.index(str(path), progress=False)  # its catalog, into its manifest
    return every_row(meshfeed.open_source(str(path)))


def _pixels(record: dict[str, Any], rng: Any) -> dict[str, Any]:
    import meshfeed

    return {"pixels": meshfeed.vision.decode(record["image"])}


def read_image(path: Path, j: int) -> Rows:
    """The image decoded as a user's job decodes it: ``meshfeed.vision.decode`` as the
    record transform of a ``Loader`` over the ``ImageFolderSource`` (in this process)."""
    import jax

    import meshfeed

    source = meshfeed.ImageFolderSource(files=[str(path)])
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=1, devices=jax.devices()[:1]))
    with meshfeed.Loader(
        source, global_batch_size=len(source), sharding=sharding, record_transform=_pixels,
        shuffle=False,
    ) as loader:  # fmt: skip
        batch = next(iter(loader))
    pixels, mask = np.asarray(batch["pixels"]), np.asarray(batch["mask"])
    return [{"pixels": p} for p, kept in zip(pixels, mask, strict=True) if kept]


READERS: dict[str, Callable[[Path, int], Rows]] = {
    "parquet": read_parquet, "tar": read_tar, "jsonl": read_jsonl,
    "tfrecord": read_tfrecord, "folder": read_folder, "images": read_image,
}  # fmt: skip


# -- what the oracle's rows hold, in meshfeed's terms ----------------------------------------


def expected_rows(fmt: str, j: int, oracle: Rows) -> Rows:
    """The oracle's rows as meshfeed is asked for them: for JSON Lines and TFRecord the
    fields given (odd files) or those of the first record (even files), a field a record
    lacks ``MISSING``; for odd tar files the members decoded."""
    if fmt == "jsonl":
        first = oracle[0] if oracle and isinstance(oracle[0], dict) else {}
        names = list(JSONL_FIELDS) if j % 2 else list(first)
        return [{n: r.get(n, MISSING) if isinstance(r, dict) else MISSING for n in names}
                for r in oracle]  # fmt: skip
    if fmt == "tfrecord":
        names = list(TFRECORD_FEATURES) if j % 2 else list(oracle[0]) if oracle else []
        return [{n: r.get(n, MISSING) for n in names} for r in oracle]
    if fmt == "tar" and j % 2:  # decoded as webdataset's .decode() does
        from webdataset.autodecode import decoders

        return [{k: decoders[k](v) if k in TAR_DECODE else v for k, v in r.items()}
                for r in oracle]  # fmt: skip
    return oracle


def meshfeed_in_oracle_terms(fmt: str, rows: Rows) -> Rows:
    """meshfeed's TFRecord values as lists of values (a number or bytes as a list of one),
    as ``oracle_tfrecord`` gives them."""
    if fmt != "tfrecord":
        return rows
    return [{n: [v] if isinstance(v, bytes | np.generic) else v for n, v in row.items()}
            for row in rows]  # fmt: skip


# -- comparing values, strictly ---------------------------------------------------------


def _kind(value: Any) -> str:
    """A value's kind: bool, int, float, complex, str, bytes, none, seq, dict, other."""
    if value is None:
        return "none"
    if isinstance(value, bool | np.bool_):
        return "bool"
    if isinstance(value, int | np.integer):
        return "int"
    if isinstance(value, float | np.floating):
        return "float"
    if isinstance(value, complex | np.complexfloating):
        return "complex"
    if isinstance(value, str | np.str_):
        return "str"
    if isinstance(value, bytes | bytearray | memoryview | np.bytes_):
        return "bytes"
    if isinstance(value, list | tuple | np.ndarray):
        return "seq"
    if isinstance(value, dict):
        return "dict"
    return "other"


_ARRAY_KINDS = {"b": "bool", "i": "int", "u": "int", "f": "float", "c": "complex", "U": "str",
                "S": "bytes"}  # fmt: skip


def same(got: Any, want: Any) -> bool:
    """``got`` (meshfeed's) holds exactly ``want`` (the oracle's): the rules in the module
    docstring."""
    if want is MISSING or got is MISSING:
        return False
    if isinstance(got, np.ndarray) and got.ndim == 0:
        got = got[()]
    if isinstance(want, np.ndarray) and want.ndim == 0:
        want = want[()]
    if isinstance(got, np.ndarray) and isinstance(want, np.ndarray):
        gk, wk = _ARRAY_KINDS.get(got.dtype.kind), _ARRAY_KINDS.get(want.dtype.kind)
        if gk is not None and wk is not None:
            if gk != wk or got.shape != want.shape:
                return False
            if gk in ("float", "complex"):
                return bool(np.array_equal(got, want, equal_nan=True))
            return bool(np.array_equal(got, want))
    g, w = _kind(got), _kind(want)
    if g == "seq" and w == "seq":
        return len(got) == len(want) and all(same(a, b) for a, b in zip(got, want, strict=True))
    if g == "dict" and w == "dict":
        return list(got) == list(want) and all(same(got[k], want[k]) for k in want)
    if (g, w) == ("float", "int"):  # a JSON integer read into a float field, if exact
        return float(got) == want and int(float(got)) == want
    if g != w:
        return False
    if g == "float":
        a, b = float(got), float(want)
        return a == b or (math.isnan(a) and math.isnan(b))
    if g == "bytes":
        return bytes(got) == bytes(want)
    if g == "none":
        return True
    if g == "other":
        return got is want or bool(got == want)
    return got == want


def first_difference(got: Rows, want: Rows) -> str | None:
    """Where meshfeed's rows and the oracle's first differ, in a line; ``None`` if equal."""
    if len(got) != len(want):
        return f"meshfeed read {len(got)} rows, the oracle {len(want)}"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if list(a) != list(b) and sorted(a) != sorted(b):
            return f"row {i}: meshfeed's fields {sorted(a)}, the oracle's {sorted(b)}"
        for name in b:
            if not same(a[name], b[name]):
                ours, theirs = _short(a[name]), _short(b[name])
                return f"row {i}, field {name!r}: meshfeed {ours}, oracle {theirs}"
    return None


def _short(value: Any, width: int = 90) -> str:
    if isinstance(value, np.ndarray):
        text = f"{value.dtype}{list(value.shape)} {np.array2string(value.ravel()[:8], threshold=8)}"
    else:
        text = f"{type(value).__name__} {value!r}"
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


# -- mutations -------------------------------------------------------------------------


def mutate(data: bytes, k: int, rng: np.random.Generator) -> tuple[bytes, str]:
    """``data`` cut, bit-flipped or zeroed in part (by ``k``: the kinds in turn), and how."""
    n = len(data)
    kind = ("cut", "flip", "zero")[k % 3]
    if n == 0:
        return data, "unchanged (empty)"
    if kind == "cut":
        at = int(rng.integers(0, n))
        return data[:at], f"cut at byte {at} of {n}"
    out = bytearray(data)
    if kind == "flip":
        bits = sorted(int(b) for b in rng.integers(0, 8 * n, int(rng.integers(1, 9))))
        for b in bits:
            out[b // 8] ^= 1 << (b % 8)
        where = ", ".join(f"{b // 8}.{b % 8}" for b in bits)
        return bytes(out), f"bits flipped at {where} (byte.bit) of {n}"
    start = int(rng.integers(0, n))
    length = int(rng.integers(1, min(256, n - start) + 1))
    out[start : start + length] = bytes(length)
    return bytes(out), f"bytes {start}..{start + length - 1} zeroed of {n}"


def files_of(path: Path) -> list[str]:
    """A file's name, or a folder's files relative to it (sorted)."""
    if path.is_file():
        return [path.name]
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


# -- the child ---------------------------------------------------------------------------


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """``Hung`` raised in the block past ``seconds`` (Python code only); past ``HARD_S``
    faulthandler dumps every thread and ends the process (code stuck in C)."""

    def ring(signum: int, frame: Any) -> None:
        raise Hung(f"still running after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(HARD_S, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


def error_line(error: BaseException, width: int = 240) -> str:
    text = " ".join(str(error).split()) or "(no message)"
    text = text if len(text) <= width else text[: width - 3] + "..."
    return f"{type(error).__name__}: {text}"


def names_file(error: BaseException, copy: Path, target: str) -> bool:
    """Whether ``error``'s message names the damaged file: its path or its name (a single
    file), its path or its path in the folder (a folder's file, ``x/00001.npy``)."""
    text = str(error)
    full = copy / target if copy.is_dir() else copy
    return str(full) in text or os.path.realpath(full) in text or target in text


def outcome(fmt: str, j: int, copy: Path, target: str, written: Rows) -> tuple[str, str]:
    """The outcome of reading ``copy`` (a file, or a folder whose ``target`` is damaged),
    and a line saying what happened."""
    try:
        with deadline(SOFT_S):
            oracle: Rows | None = expected_rows(fmt, j, ORACLES[fmt](copy))
        refusal = ""
    except (Exception, Hung) as error:  # the peer refuses it (a hang of the peer too)
        oracle, refusal = None, error_line(error, 120)
    try:
        with deadline(SOFT_S):
            got = meshfeed_in_oracle_terms(fmt, READERS[fmt](copy, j))
    except Hung as error:
        return "other", f"hang: {error} (a read in Python that does not end)"
    except Exception as error:
        if names_file(error, copy, target):
            return "refused", error_line(error, 160)
        return "other", f"an error that does not name {target}: {error_line(error)}"
    except BaseException as error:
        return "other", f"not an Exception: {error_line(error)}"
    if oracle is not None:
        diff = first_difference(got, oracle)
        if diff is None:
            return "equal", ""
        if first_difference(got, written) is None:
            return "other", f"rows as written, but the oracle read other rows: {diff}"
        return "other", f"rows other than the oracle's: {diff}"
    diff = first_difference(got, written)
    if diff is None:
        return "as written", f"the oracle refused: {refusal}"
    return "other", f"rows read where the oracle refused ({refusal}); as written: {diff}"


def originals(fmt: str, work: Path, files: int) -> list[Path]:
    """The format's files (written once: a restarted child finds them)."""
    home = work / "originals"
    home.mkdir(parents=True, exist_ok=True)
    out = []
    for j in range(files):
        done = home / f"{j}.done"
        folder = home / str(j)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            name = WRITERS[fmt](folder, j).name
            done.write_text(name)
        out.append(folder / done.read_text())
    return out


PEERS = {"parquet": ["pyarrow.parquet"], "tar": ["webdataset.tariterators", "webdataset.writer"],
         "jsonl": [], "tfrecord": ["tfrecord.reader", "tfrecord.writer"], "folder": [],
         "images": ["PIL.Image"]}  # fmt: skip
"""The peers' modules each format's child imports."""


def _bare_package(name: str) -> None:
    """``name``'s modules importable without its ``__init__`` (which imports more)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations is not None, name
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules[name] = package


MARK = "-- fuzz mutation "
"""Starts a mutation's part of the child's stderr."""


def emit(**line: Any) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def main(fmt: str, work: Path, files: int, start: int) -> int:
    """Runs mutations ``start`` onwards of ``fmt``'s ``files`` files (a JSON line as each
    starts and ends, then the counts); 3 if meshfeed misreads an undamaged file."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if fmt == "tfrecord":  # its reader and writer, not its torch dataset (torch: 4 s)
        _bare_package("tfrecord")
    for name in PEERS[fmt]:  # every import done before the address space is bound
        importlib.import_module(name)
    import meshfeed.vision  # noqa: F401

    status = Path("/proc/self/status").read_text()
    size = int(re.search(r"VmSize:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]
    resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY_BYTES, resource.RLIM_INFINITY))
    began = time.perf_counter()
    paths = originals(fmt, work, files)
    written = []
    for j, path in enumerate(paths):  # the harness's check: undamaged, they read equal
        place = work / "as-written" / str(j)
        shutil.rmtree(place, ignore_errors=True)
        shutil.copytree(path.parent, place)
        rows = expected_rows(fmt, j, ORACLES[fmt](place / path.name))
        result, detail = outcome(fmt, j, place / path.name, path.name, rows)
        if result != "equal":
            emit(event="broken", file=j, detail=f"{result}: {detail}")
            return 3
        written.append(rows)
        shutil.rmtree(place)
    counts = {"equal": 0, "as written": 0, "refused": 0, "other": 0}
    for t in range(start, files * MUTATIONS):
        j, k = divmod(t, MUTATIONS)
        rng = np.random.default_rng([SEEDS[fmt], j, k])
        original = paths[j]
        inside = files_of(original)
        target = inside[int(rng.integers(0, len(inside)))] if original.is_dir() else original.name
        source = original / target if original.is_dir() else original
        data, what = mutate(source.read_bytes(), k, rng)
        if original.is_dir():
            what = f"{target}: {what}"
        emit(event="start", t=t, file=j, mutation=k, what=what)
        sys.stderr.write(f"{MARK}{t}\n")  # what follows on stderr is this mutation's
        sys.stderr.flush()
        place = work / "copies" / f"{j}-{k}"
        shutil.rmtree(place, ignore_errors=True)
        place.mkdir(parents=True)
        copy = place / original.name
        if original.is_dir():
            shutil.copytree(original, copy)
            (copy / target).write_bytes(data)
        else:
            copy.write_bytes(data)
        result, detail = outcome(fmt, j, copy, target, written[j])
        counts[result] += 1
        emit(event="end", t=t, file=j, mutation=k, what=what, outcome=result, detail=detail)
        shutil.rmtree(place, ignore_errors=True)
    emit(event="done", format=fmt, files=files, mutations=MUTATIONS, start=start, **counts,
         seconds=round(time.perf_counter() - began, 2))  # fmt: skip
    return 0


if __name__ == "__main__":
    _fmt, _work, _files, _start = sys.argv[1:5]
    sys.exit(main(_fmt, Path(_work), int(_files), int(_start)))
