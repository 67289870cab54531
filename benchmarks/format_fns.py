"""Set-up and per-record functions of the file-format workloads (importable by workers)."""

from __future__ import annotations

import numpy as np


def write_parquet(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = pa.array(images.reshape(-1))
    image = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(flat, 28), 28)
    pq.write_table(pa.table({"image": image, "label": labels}), path, row_group_size=1000)


def write_arrayrecord(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(path, "group_size:1")
    for image, label in zip(images, labels, strict=True):
        writer.write(image.tobytes() + label.tobytes())
    writer.close()


def decode_record(raw: bytes) -> dict[str, np.ndarray]:
    """784 image bytes + an int64 label, as written by ``write_arrayrecord``."""
    return {
        "image": np.frombuffer(raw, np.uint8, 784).reshape(28, 28),
        "label": np.frombuffer(raw, np.int64, 1, 784)[0],
    }
