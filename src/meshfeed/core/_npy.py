"""numpy's ``.npy`` and ``.npz`` bytes parsed one header at a time.

numpy parses an array's header with ``ast.literal_eval``, and CPython 3.11's parser, run
on two threads at once, can fail with "SystemError: AST constructor recursion depth
mismatch". meshfeed parses headers on the read-ahead's threads (a file's first read, a
WebDataset ``.npy`` member, an index loaded on first use), so every parse takes
``NPY_HEADERS`` first. It guards the parse only: the data is read outside it.
"""

from __future__ import annotations

import io
import threading

import numpy as np

NPY_HEADERS = threading.Lock()


def load_npy(data: bytes) -> np.ndarray:
    """The array in the bytes of a whole ``.npy`` file (no pickles)."""
    with NPY_HEADERS:
        return np.load(io.BytesIO(data), allow_pickle=False)


def load_npz(data: bytes) -> dict[str, np.ndarray]:
    """Every array in the bytes of a whole ``.npz`` file, by name (no pickles)."""
    with NPY_HEADERS, np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}
