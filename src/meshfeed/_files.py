"""Rows of ``.npy`` files read by byte range, on local disk or behind an fsspec URL.

A ``.npy`` file is a short header and then the rows, one after another, each
``row_bytes`` long. So the rows a process needs are byte ranges: consecutive ids are one
range, and nothing else of the file is read -- not on disk (``pread``, which maps
nothing into the process) and not on an object store (``cat_ranges``, one request per
range, issued together). A ``.npy`` member stored uncompressed in a ``.npz`` is the
same thing at an offset inside the zip.
"""

from __future__ import annotations

import io
import os
import struct
import weakref
import zipfile
from typing import Any

import numpy as np

_MAGIC = b"\x93NUMPY"


def is_url(path: str) -> bool:
    return "://" in path


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError:
        raise ImportError(
            "reading a URL needs fsspec: pip install 'meshfeed[remote]' (or pip install "
            "fsspec plus the filesystem's package, e.g. s3fs or gcsfs)."
        ) from None
    return fsspec


class Blob:
    """One file, local or remote, read by byte range."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        if is_url(path):
            self._fs, self._fs_path = _fsspec().core.url_to_fs(path)
        else:
            self._fs, self._fs_path = None, path

    def size(self) -> int:
        try:
            if self._fs is None:
                return os.stat(self.path).st_size
            return int(self._fs.size(self._fs_path))
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} does not exist.") from None

    def read(self, start: int, end: int) -> bytes:
        return self.read_ranges([start], [end])[0]

    def read_ranges(self, starts: list[int], ends: list[int]) -> list[bytes]:
        if self._fs is not None:
            paths = [self._fs_path] * len(starts)
            return list(self._fs.cat_ranges(paths, starts, ends))
        fd = self._open()
        out = []
        for start, end in zip(starts, ends, strict=True):
            out.append(os.pread(fd, end - start, start))
        return out

    def read_into(self, views: list[memoryview], starts: list[int]) -> None:
        """Fills each view from its offset (local files: no intermediate copy)."""
        if self._fs is not None:
            ends = [s + len(v) for v, s in zip(views, starts, strict=True)]
            for view, data in zip(views, self.read_ranges(starts, ends), strict=True):
                if len(data) != len(view):
                    raise OSError(f"{self.path} ended early: it is truncated.")
                view[:] = data
            return
        fd = self._open()
        for view, at in zip(views, starts, strict=True):
            done = 0
            while done < len(view):
                got = os.preadv(fd, [view[done:]], at + done)
                if got == 0:
                    raise OSError(f"{self.path} ended early: it is truncated.")
                done += got

    def _open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.path} does not exist.") from None
            weakref.finalize(self, os.close, self._fd)
        return self._fd

    def __getstate__(self) -> dict[str, Any]:  # workers reopen the file themselves
        return {**self.__dict__, "_fd": None}


class NpyRows:
    """The rows of one ``.npy`` array (a file, or a stored ``.npz`` member at ``at``)."""

    def __init__(self, blob: Blob, *, at: int = 0, name: str | None = None) -> None:
        self.blob = blob
        self.name = name or blob.path
        self.shape, self.dtype, self.data_offset = _read_header(blob, at, self.name)
        if self.dtype.hasobject:
            raise ValueError(
                f"{self.name} holds Python objects (dtype {self.dtype}), which .npy stores "
                "pickled; meshfeed reads fixed-size rows only. Pad the field to a fixed "
                "shape, or keep variable-length values in Parquet or ArrayRecord."
            )
        if not self.shape:
            raise ValueError(f"{self.name} is a 0-d array; it needs a leading example dimension.")
        self.rows = self.shape[0]
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self.bytes_read = 0

    def check_size(self, size: int | None = None) -> None:
        """Raises if the file is shorter (or longer) than its header says."""
        want = self.data_offset + self.rows * self.row_bytes
        got = self.blob.size() if size is None else size
        if got < want:
            raise ValueError(
                f"{self.name} is truncated: its header says {self.rows} rows of "
                f"{self.row_bytes} bytes ({want} bytes in all), the file has {got}."
            )

    def read(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (sorted or not, repeats allowed) of this array."""
        out = np.empty((len(ids), *self.shape[1:]), self.dtype)
        if not len(ids) or not self.row_bytes:
            return out
        if ids.min() < 0 or ids.max() >= self.rows:
            raise IndexError(f"ids outside [0, {self.rows}) for {self.name}.")
        order = np.argsort(ids, kind="stable")
        ordered = ids[order]
        unique, inverse = np.unique(ordered, return_inverse=True)
        rows = np.empty((len(unique), self.row_bytes), np.uint8)
        # Consecutive ids are one range.
        starts = np.flatnonzero(np.diff(unique, prepend=unique[0] - 2) != 1)
        ends = np.append(starts[1:], len(unique))
        views = [
            memoryview(rows[a:b]).cast("B")  # type: ignore[arg-type]
            for a, b in zip(starts, ends, strict=True)
        ]
        offsets = [self.data_offset + int(unique[a]) * self.row_bytes for a in starts]
        self.blob.read_into(views, offsets)
        self.bytes_read += rows.nbytes
        out.reshape(len(ids), -1).view(np.uint8)[order] = rows[inverse]
        return out


def _read_header(blob: Blob, at: int, name: str) -> tuple[tuple[int, ...], np.dtype, int]:
    head = blob.read(at, at + 12)
    if len(head) < 10 or not head.startswith(_MAGIC):
        raise ValueError(f"{name} is not a .npy array (no NUMPY magic at its start): corrupt?")
    major = head[6]
    if major == 1:
        length, fixed = struct.unpack("<H", head[8:10])[0], 10
    elif major in (2, 3):
        length, fixed = struct.unpack("<I", head[8:12])[0], 12
    else:
        raise ValueError(f"{name} has .npy format version {major}, which meshfeed cannot read.")
    prefix = blob.read(at, at + fixed + length)
    if len(prefix) < fixed + length:
        raise ValueError(f"{name} is truncated inside its .npy header.")
    fp = io.BytesIO(prefix)
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
    except ValueError as error:
        raise ValueError(f"{name} has a corrupt .npy header ({error}).") from None
    if fortran and len(shape) > 1:
        raise ValueError(
            f"{name} is stored in Fortran order; rows are not contiguous. Save it with "
            "np.save(path, np.ascontiguousarray(x))."
        )
    return tuple(shape), np.dtype(dtype), at + fixed + length


def npz_members(blob: Blob) -> dict[str, NpyRows]:
    """The arrays of an ``.npz``, each read in place (members must be stored, not deflated)."""
    if blob._fs is not None:
        handle: Any = blob._fs.open(blob._fs_path, "rb")
    else:
        handle = open(blob.path, "rb")  # noqa: SIM115 -- closed below
    members = {}
    try:
        with zipfile.ZipFile(handle) as archive:
            for info in archive.infolist():
                field = info.filename.removesuffix(".npy")
                if info.compress_type != zipfile.ZIP_STORED:
                    raise ValueError(
                        f"{blob.path} member {info.filename!r} is compressed "
                        "(np.savez_compressed), so its rows cannot be read in place; save "
                        "with np.savez, or write the arrays with meshfeed.write_source."
                    )
                local = blob.read(info.header_offset, info.header_offset + 30)
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                at = info.header_offset + 30 + name_len + extra_len
                members[field] = NpyRows(blob, at=at, name=f"{blob.path}[{field}]")
    finally:
        handle.close()
    return members
