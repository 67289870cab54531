"""How the record stage names a record that failed, wherever the record ran.

A record transform runs in the loading process, a worker thread, a worker process or a
Ray actor; what it raises reaches the loop thread as one message, built here
(``Failure.message``) for all four::

    record_transform raised on example 17 (/data/train/cat/b.jpg) in a worker process:
    OSError: image file is truncated

then, from another process, the traceback as text; in this process the exception
itself is the ``__cause__``. ``transform_rows`` wraps what the transform raises in a
``RecordFailed``, whose ``Failure`` holds only ids, the error's line and (to cross a
pipe) its traceback: a worker knows no source, so the loading process names the example
(``ExampleNames``): its id, and its file where the source says (``Origins``).

A record transform with a batch form decodes a chunk of records together, so its error
is the chunk's; the record stage then runs the chunk's records one at a time to find the
one at fault (``_record_rows``). A ``Failure`` with ``chunk`` set is the rare rest: the
chunk raised and none of its records alone, a batch form that breaks its promise.
"""

from __future__ import annotations

import traceback
from typing import NamedTuple, NoReturn

import numpy as np

from meshfeed.data._bad_records import error_line
from meshfeed.data._sources import Origins

_LISTED = 8  # a chunk's example ids named in a message, at most


class ExampleNames:
    """Names examples in messages: ``example 17 (/data/train/cat/b.jpg)``, the source's
    ``origin`` in parentheses where it has one (``Origins``), else ``example 17``."""

    def __init__(self, source: object = None) -> None:
        self._origin = source.origin if isinstance(source, Origins) else None

    def __call__(self, example: int) -> str:
        if self._origin is None or example < 0:
            return f"example {example}"
        try:
            where = self._origin(example)
        except Exception:  # a message is being built: the id is enough
            return f"example {example}"
        return f"example {example} ({where})"


class Failure(NamedTuple):
    """A record transform's error, as it travels from where it ran: the example it was
    raised on (with ``chunk``: the chunk's examples, none of which raised alone), the
    error's line, and its traceback where it comes from another process."""

    examples: tuple[int, ...]
    line: str
    trace: str = ""
    chunk: bool = False

    def message(self, where: str, names: ExampleNames) -> str:
        """The one message of a record that failed ``where`` (``in a worker thread``)."""
        if self.chunk:
            listed = ", ".join(str(i) for i in self.examples[:_LISTED])
            if len(self.examples) > _LISTED:
                listed += f", ... ({len(self.examples)} in all)"
            head = (
                f"record_transform raised on the chunk of examples {listed} {where} (its "
                "batch form, on the chunk together), but on none of them alone: "
                f"{self.line.rstrip('.')}. Its batch() must give each record what the "
                "transform gives it alone: fix batch(), or drop prepare() and batch() to run "
                "records one by one."
            )
        else:
            example = names(self.examples[0]) if self.examples else "an example"
            head = f"record_transform raised on {example} {where}: {self.line}"
        return f"{head}\n{self.trace.rstrip()}" if self.trace else head


class RecordFailed(Exception):
    """What ``transform_rows`` raises: its ``Failure``; the transform's own error (or,
    for a chunk, its batch form's) is the ``__cause__``."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure)
        self.failure = failure

    def __str__(self) -> str:
        return self.failure.message("in a record transform", ExampleNames())


def failure_of(error: BaseException, ids: np.ndarray, *, trace: bool = False) -> Failure:
    """The ``Failure`` of ``error``, raised by work on the examples ``ids`` (an error not
    from the transform -- the work around it -- is put on the first of them); with
    ``trace``, its traceback as text, to send to another process."""
    if isinstance(error, RecordFailed):
        failure = error.failure
    else:
        first = next((int(i) for i in np.asarray(ids).tolist() if i >= 0), -1)
        failure = Failure((first,), error_line(error))
    if trace:
        failure = failure._replace(trace="".join(traceback.format_exception(cause_of(error))))
    return failure


def cause_of(error: BaseException) -> BaseException:
    """The exception a record stage's error has as its cause: the transform's own."""
    if isinstance(error, RecordFailed) and error.__cause__ is not None:
        return error.__cause__
    return error


def raise_failure(
    error: BaseException, ids: np.ndarray, where: str, names: ExampleNames
) -> NoReturn:
    """Raises the one message (``Failure.message``) of ``error``, raised on ``ids``
    ``where`` in this process, from the transform's own exception."""
    raise RuntimeError(failure_of(error, ids).message(where, names)) from cause_of(error)
