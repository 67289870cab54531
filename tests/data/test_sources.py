import numpy as np
import pytest

import meshfeed


def test_array_source_gathers_rows_and_describes_fields():
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    y = np.arange(10, dtype=np.int64)
    src = meshfeed.ArraySource({"x": x, "y": y})
    assert isinstance(src, meshfeed.Source)
    assert len(src) == 10
    assert src.fields["x"] == meshfeed.sources.FieldSpec((3,), np.dtype(np.float32))
    out = src[np.array([4, 0, 4])]
    np.testing.assert_array_equal(out["x"], x[[4, 0, 4]])
    np.testing.assert_array_equal(out["y"], [4, 0, 4])


def test_array_source_reads_memmap(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(40, dtype=np.int32).reshape(20, 2))
    src = meshfeed.ArraySource({"x": np.load(path, mmap_mode="r")})
    np.testing.assert_array_equal(src[np.array([19, 1])]["x"], [[38, 39], [2, 3]])


def test_array_source_rejects_fields_of_different_lengths():
    with pytest.raises(ValueError, match=r"different lengths \{'x': 10, 'y': 9\}"):
        meshfeed.ArraySource({"x": np.zeros(10), "y": np.zeros(9)})


@pytest.mark.parametrize(
    ("arrays", "error", "match"),
    [
        ({}, TypeError, "non-empty mapping"),
        ({"x": [1, 2]}, TypeError, "field 'x' is a list"),
        ({"x": np.float32(1)}, TypeError, "field 'x' is a float32"),
        ({"x": np.array(1)}, ValueError, "0-d array"),
    ],
)
def test_array_source_rejects_bad_arrays(arrays, error, match):
    with pytest.raises(error, match=match):
        meshfeed.ArraySource(arrays)


@pytest.mark.parametrize("pread", [True, False])
def test_memmap_reads_give_the_rows_asked_for_in_order(tmp_path, pread):
    data = np.arange(50 * 6, dtype=np.int16).reshape(50, 3, 2)
    np.save(tmp_path / "x.npy", data)
    src = meshfeed.ArraySource({"x": np.load(tmp_path / "x.npy", mmap_mode="r")}, pread=pread)
    ids = np.array([49, 3, 4, 5, 3, 0, 48, 49])  # runs, repeats, any order
    np.testing.assert_array_equal(src[ids]["x"], data[ids])
    assert src[np.array([], np.int64)]["x"].shape == (0, 3, 2)


def test_memmap_reads_do_not_map_the_file_into_the_process(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "big.npy"
    rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(2048, 2**16))
    rows[:] = 7  # 128 MiB
    rows.flush()
    del rows
    code = (
        "import numpy as np, resource, meshfeed\n"
        f"src = meshfeed.ArraySource({{'x': np.load({str(path)!r}, mmap_mode='r')}})\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "for k in range(0, 2048, 64): assert src[np.arange(k, k + 64)]['x'].max() == 7\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    grown_kib = int(subprocess.check_output([sys.executable, "-c", code], timeout=120))
    assert grown_kib < 64 * 1024, grown_kib  # 128 MiB read, far less resident


@pytest.mark.parametrize("row", [(4,), (64, 64)])  # 16 B rows gathered; 16 KiB rows one by one
@pytest.mark.parametrize("kind", ["memory", "memmap", "memmap-no-pread"])
def test_read_into_fills_the_rows_read_would_give(tmp_path, row, kind):
    data = np.arange(50 * int(np.prod(row)), dtype=np.float32).reshape(50, *row)
    if kind != "memory":
        np.save(tmp_path / "x.npy", data)
        data = np.load(tmp_path / "x.npy", mmap_mode="r")
    source = meshfeed.ArraySource(
        {"x": data, "label": np.arange(50, dtype=np.int32)}, pread=kind != "memmap-no-pread"
    )
    ids = np.array([7, 3, 3, 49, 0, 12])  # any order, repeats
    out = {"x": np.full((6, *row), -1, np.float32), "label": np.full(6, -1, np.int32)}
    source.read_into(ids, out)
    for name, rows in source[ids].items():
        np.testing.assert_array_equal(out[name], rows)


def test_rows_read_into_the_workers_input_block_are_the_rows_read_here(tmp_path):
    import record_fns

    big = np.arange(40 * 64 * 64, dtype=np.float32).reshape(40, 64, 64)  # 16 KiB rows
    np.save(tmp_path / "big.npy", big)
    mesh = meshfeed.make_mesh(data=8)

    def batches(workers, array):
        loader = meshfeed.Loader(
            meshfeed.ArraySource({"x": array, "label": np.arange(40, dtype=np.int32)}),
            global_batch_size=8, sharding=meshfeed.batch_sharding(mesh), seed=4,
            record_transform=record_fns.copy_rows, num_workers=workers, last_batch="pad",
        )  # fmt: skip
        try:
            return [{k: np.asarray(v) for k, v in b.items()} for b in loader]
        finally:
            loader.close()

    want = batches(0, big)
    for array in (big, np.load(tmp_path / "big.npy", mmap_mode="r")):
        got = batches(2, array)
        assert len(got) == len(want) == 5
        for g, w in zip(got, want, strict=True):
            for name in w:
                np.testing.assert_array_equal(g[name], w[name])


def test_a_memmap_source_pickles_as_its_path_not_its_rows(tmp_path):
    import pickle

    np.save(tmp_path / "x.npy", np.arange(250_000, dtype=np.float32).reshape(2500, 100))
    source = meshfeed.ArraySource({"x": np.load(tmp_path / "x.npy", mmap_mode="r")})
    sent = pickle.dumps(source)  # what a Ray worker that reads the source itself gets
    assert len(sent) < 4096
    ids = np.array([5, 2499, 0])
    np.testing.assert_array_equal(pickle.loads(sent)[ids]["x"], source[ids]["x"])
