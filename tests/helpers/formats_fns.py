"""Streaming files written by other libraries (and tools), and streams of them, for the
format tests; importable by name in the processes of ``run_in_processes``."""

from __future__ import annotations

import gc
import gzip
import io
import json
import subprocess
import tarfile
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

import meshfeed
from meshfeed.testing import local_shards

SAMPLES = 90


def payload(i: int) -> bytes:
    """Sample ``i``'s image bytes: a different length and content for every sample."""
    return bytes((i * 7 + k) % 251 for k in range(20 + (i * 37) % 300))


def write_wds(folder: Path, n: int = SAMPLES, per_shard: int = 25) -> list[str]:
    """Shards written by webdataset's own ``ShardWriter``: png (bytes), cls, id, json."""
    from webdataset.writer import ShardWriter

    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "shard-%03d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(n):
            sink.write({"__key__": f"s{i:05d}", "png": payload(i), "cls": str(i % 10),
                        "id": str(i), "json": {"i": i, "even": i % 2 == 0}})  # fmt: skip
    return sorted(str(p) for p in folder.glob("shard-*.tar"))


def write_tar_command(folder: Path, n: int = 30) -> str:
    """A shard made by GNU ``tar`` from files on disk (a long name among them)."""
    files = folder / "files"
    files.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        key = f"{'deep/' * 30 if i == 7 else ''}k{i:04d}"  # a path over 100 bytes: a GNU long name
        (files / key).parent.mkdir(parents=True, exist_ok=True)
        (files / f"{key}.txt").write_bytes(payload(i))
        (files / f"{key}.id").write_text(str(i))
        names += [f"{key}.id", f"{key}.txt"]
    shard = folder / "made-by-tar.tar"
    subprocess.run(["tar", "cf", str(shard), *names], cwd=files, check=True)
    return str(shard)


BIG = 512 << 10
"""A large member's bytes: 34 of them make a shard past the 16 MiB one member may hold."""


def big(i: int) -> bytes:
    """Sample ``i``'s large member: compressible, different for every sample."""
    return (payload(i) * (BIG // 20 + 1))[:BIG]


def write_compressed(folder: Path, writer: str, n: int = 34) -> str:
    """A compressed shard of one member, as ``writer`` writes it: Python's ``tarfile``
    (``"w:gz"``), webdataset's ``TarWriter`` (a ``.tgz``), or ``zstd`` over a plain tar
    (one frame); ``n`` samples of a large ``bin`` and a ``cls`` member."""
    folder.mkdir(parents=True, exist_ok=True)
    samples = [(f"s{i:04d}", {"bin": big(i), "cls": str(i % 10).encode()}) for i in range(n)]
    if writer == "webdataset":
        from webdataset.writer import TarWriter

        path = folder / "shard.tgz"
        with TarWriter(str(path)) as sink:
            for key, members in samples:
                sink.write({"__key__": key, **members})
        return str(path)
    buffer = io.BytesIO()
    options = {"mode": "w:gz", "compresslevel": 1} if writer == "tarfile" else {"mode": "w"}
    with tarfile.open(fileobj=buffer, **options) as archive:  # type: ignore[call-overload]
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    if writer == "zstd":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path = folder / ("shard.tar.gz" if writer == "tarfile" else "shard.tar.zst")
    path.write_bytes(data)
    return str(path)


def read_as_peers_do(path: str) -> dict[str, dict[str, bytes]]:
    """Every sample of a compressed shard, key -> extension -> bytes, as webdataset reads
    it (Python's ``tarfile`` in stream mode), or through ``zstandard`` for a ``.zst``."""
    out: dict[str, dict[str, bytes]] = {}
    if path.endswith(".zst"):
        import zstandard

        with (
            open(path, "rb") as f,
            zstandard.ZstdDecompressor().stream_reader(f) as stream,
            tarfile.open(fileobj=stream, mode="r|") as archive,
        ):
            for member in archive:
                key, _, ext = member.name.partition(".")
                data = archive.extractfile(member)
                out.setdefault(key, {})[ext] = data.read() if data is not None else b""
        return out
    from webdataset.compat import WebDataset

    with warnings.catch_warnings():  # webdataset leaves its shard files for the collector
        warnings.simplefilter("ignore", ResourceWarning)
        for sample in WebDataset(path, shardshuffle=False):
            out[sample["__key__"]] = {k: v for k, v in sample.items() if not k.startswith("__")}
        gc.collect()
    return out


def write_tfrecord_gz(folder: Path, n: int = 30) -> str:
    """A ``.tfrecord.gz`` as TensorFlow writes one (a gzip stream of one member), of the
    ``tfrecord`` package's records: ``n`` of 100 KB images and a label."""
    from tfrecord.writer import TFRecordWriter

    folder.mkdir(parents=True, exist_ok=True)
    plain = str(folder / "plain.tfrecord")
    writer = TFRecordWriter(plain)
    for i in range(n):
        writer.write({"image": (big(i)[:100_000], "byte"), "label": (i, "int")})
    writer.close()
    path = folder / "records.tfrecord.gz"
    path.write_bytes(gzip.compress(Path(plain).read_bytes(), mtime=0))
    return str(path)


def sized(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A record transform: a shard's sample, its large member as its length."""
    return {"cls": record["cls"], "size": np.int32(len(record["bin"]))}


def records(n: int = SAMPLES) -> list[dict[str, Any]]:
    return [{"id": i, "text": "x" * (i % 13), "tokens": list(range(i % 7 + 1)), "score": i / 4}
            for i in range(n)]  # fmt: skip


def write_jsonl(folder: Path, kind: str, n: int = SAMPLES, files: int = 3) -> list[str]:
    """JSON Lines in ``files`` files: plain, or gzip/zstd in members of 10 records (the
    seekable layout, as ``meshfeed index --seekable`` writes it)."""
    import zstandard

    folder.mkdir(parents=True, exist_ok=True)
    rows = records(n)
    paths = []
    for k in range(files):
        lines = [json.dumps(r) + "\n" for r in rows[k::files]]
        path = folder / f"part-{k}.jsonl{'' if kind == 'plain' else '.' + kind}"
        if kind == "plain":
            data = "".join(lines).encode()
        else:
            groups = ["".join(lines[a : a + 10]).encode() for a in range(0, len(lines), 10)]
            pack = (
                (lambda b: gzip.compress(b, mtime=0))
                if kind == "gz"
                else zstandard.ZstdCompressor().compress
            )
            data = b"".join(pack(g) for g in groups)
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def write_tfrecord(folder: Path, n: int = SAMPLES, files: int = 2) -> list[str]:
    """TFRecord files written by the ``tfrecord`` package: tf.train.Example records."""
    from tfrecord.writer import TFRecordWriter

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(files):
        path = str(folder / f"part-{k}.tfrecord")
        writer = TFRecordWriter(path)
        for i in range(k, n, files):
            writer.write({"image": (payload(i), "byte"), "label": (i, "int"),
                          "vec": ([float(i), 0.5, -1.0][: i % 3 + 1], "float")})  # fmt: skip
        writer.close()
        paths.append(path)
    return paths


def _size(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {"id": record["id"], "size": np.int32(len(record["png"]))}


def source(kind: str, paths: list[str], storage_options: Any = None) -> Any:
    if kind == "tar":
        return meshfeed.sources.TarSource(
            paths, decode={"id": "int"}, key=None, storage_options=storage_options
        )
    if kind == "jsonl":
        return meshfeed.sources.JsonlSource(paths, fields={"id": "int64", "score": "float32"},
                                    storage_options=storage_options)  # fmt: skip
    return meshfeed.sources.TFRecordSource(paths, decode="example", features={"label": "int64"},
                                   storage_options=storage_options)  # fmt: skip


def streams(cases: dict[str, tuple[list[str], Any]], skip: int = 0) -> dict[str, dict[str, Any]]:
    """``stream(kind, paths, state, skip)`` for each kind's (paths, state), one after
    another in these processes."""
    return {kind: stream(kind, paths, state, skip) for kind, (paths, state) in cases.items()}


def stream(kind: str, paths: list[str], state: dict[str, Any] | None = None, skip: int = 0,
           storage_options: Any = None, **options: Any) -> dict[str, Any]:  # fmt: skip
    """An epoch of a shuffled loader over the files, from ``state`` or after ``skip``
    steps: the state there and every later batch, as this process's shards."""
    extra: dict[str, Any] = {}
    if kind == "tar":  # the image bytes become their length, in workers
        extra = {"record_transform": _size, "num_workers": 1}
    loader = meshfeed.Loader(
        source(kind, paths, storage_options), global_batch_size=8, seed=5, last_batch="pad",
        sharding=meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count())),
        **extra, **options,
    )  # fmt: skip
    if state is not None:
        loader.restore(state)
    else:
        it = iter(loader)
        for _ in range(skip):
            next(it)
    taken = loader.state()
    batches = [{k: (v.shape, local_shards(v)) for k, v in b.items()} for b in loader]
    loader.close()
    return {"state": taken, "batches": batches}
