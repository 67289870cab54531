"""Bad records: which failures ``on_error="skip"`` skips, and which examples of a failed
read were the bad ones.

A data set of a hundred million records has a few that do not decode: a truncated JPEG,
a line that is not JSON, a record whose CRC does not match. Under ``on_error="skip"``
such an example becomes a masked row of its batch (as padding is) instead of ending the
run. What counts as a bad record is what a read of the example raises, except an
``OSError``: that is the storage speaking (a store that stays down past ``retry_s``, a
missing or unreadable file), not a record, and skipping it would quietly mask every
example while a store is down -- but a file that ends before its records do (a tar
member cut short, ``TruncatedError``) is the records' fault, and is skipped. (A record
transform's own errors are all the record's: see the record stage.)

A source reads a batch at once, so one bad example fails the whole read. ``find_bad``
then halves the ids and reads each half again, down to the examples that fail on their
own: a read of ``n`` ids with ``k`` bad ones costs about ``2 k log2(n / k)`` more reads,
and only for the batches that hold one; which examples are bad depends on the examples
alone, never on how the reads were grouped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from meshfeed.storage._blob import TruncatedError

OnError = Literal["raise", "skip"]
"""What a bad record does: end the run, naming it (``"raise"``), or be skipped and
counted (``"skip"``: a masked row in a loader's batch; a record left out by ``prepare``)."""
ON_ERROR: tuple[OnError, ...] = ("raise", "skip")

Skip = tuple[int, str]
"""One skipped example: its id, and the first line of its error (type: message)."""


def skippable(error: BaseException) -> bool:
    """Whether a failed read of examples is theirs (a bad record), not the storage's."""
    if isinstance(error, TruncatedError):  # a file cut short: its records are bad
        return True
    return isinstance(error, Exception) and not isinstance(error, OSError)


def error_line(error: BaseException) -> str:
    """``Type: message``, the message's first line only."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def find_bad(
    read: Callable[[np.ndarray], Any], ids: np.ndarray, error: BaseException
) -> list[tuple[int, str]]:
    """The positions in ``ids`` whose read fails on its own, with their error lines, given
    that ``read(ids)`` raised ``error`` (a skippable one); anything else raises."""
    if len(ids) == 1:
        return [(0, error_line(error))]
    bad: list[tuple[int, str]] = []
    half = len(ids) // 2
    for lo, part in ((0, ids[:half]), (half, ids[half:])):
        try:
            read(part)
        except Exception as failed:
            if not skippable(failed):
                raise
            bad += [(lo + at, line) for at, line in find_bad(read, part, failed)]
    if not bad:  # the halves read, the whole did not: a failure of the batch, not a record
        raise error
    return bad
