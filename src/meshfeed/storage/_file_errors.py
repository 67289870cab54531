"""A file its format cannot read, named: ``BadFileError`` and ``named``.

A user with 10^5 shards who meets pyarrow's "Couldn't deserialize thrift" or Pillow's
"image file is truncated" cannot tell which file is bad: the libraries that parse bytes
say what is wrong, not where. So every reader wraps the library calls that parse a
file's bytes in ``named(path, where)``: an error that does not already name the file is
raised again as a ``BadFileError`` that does (and the place in it: a row group, a record,
a byte offset), with the library's error as its cause.

The storage's own errors pass through as they are: a ``Blob`` already names its file,
and an ``OSError`` from it is the store speaking (down, missing, denied), which
``on_error="skip"`` must not turn into skipped records; so does any ``OSError``
subclass (``FileNotFoundError``, ``PermissionError``, ``TimeoutError``, ...). A plain
``OSError`` that does not name the file is a parser's (pyarrow raises its own so). A
``BadFileError`` is the data's fault, a ``ValueError``, so ``on_error="skip"`` skips the
examples it holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class BadFileError(ValueError):
    """A file whose bytes its format cannot read (cut short, corrupt, encrypted, or
    holding values with no array form): the message names the file and, where known,
    the place in it; the reading library's own error is the ``__cause__``."""


def names_file(error: BaseException, path: str) -> bool:
    """Whether ``error``'s message already names ``path``."""
    return path in str(error) or getattr(error, "filename", None) == path


@contextlib.contextmanager
def named(path: str, where: str = "") -> Iterator[None]:
    """Raises what the block raises, named: an error whose message does not name
    ``path`` becomes a ``BadFileError`` saying ``path``, ``where`` (``"row group 3"``,
    ``"the record at byte 120"``; may be empty) and the original error.

    Example:
      >>> with named("data/a.parquet", "its footer"):  # doctest: +SKIP
      ...     metadata = pyarrow.parquet.ParquetFile(handle).metadata
    """
    try:
        yield
    except (BadFileError, MemoryError):  # named already; the machine's, not the file's
        raise
    except Exception as error:
        if names_file(error, path) or (isinstance(error, OSError) and type(error) is not OSError):
            raise  # the store's word (missing, denied, timed out), or named already
        place = f", {where}" if where else ""
        text = str(error).strip() or "(no message)"
        raise BadFileError(f"{path}{place}: {type(error).__name__}: {text}") from error
