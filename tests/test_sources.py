import numpy as np
import pytest

import meshfeed


def test_array_source_gathers_rows_and_describes_fields():
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    y = np.arange(10, dtype=np.int64)
    src = meshfeed.ArraySource({"x": x, "y": y})
    assert isinstance(src, meshfeed.Source)
    assert len(src) == 10
    assert src.fields["x"] == meshfeed.FieldSpec((3,), np.dtype(np.float32))
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
