"""A loader's state: the steps consumed, and what the order of examples depends on.

Every process derives the schedule on its own from the source's length, the seed, the
shuffle, the global batch size and ``last_batch``, so a position in the stream is one
number. The state carries those inputs too (the *fingerprint*), so a state restored into
a loader over other data or with another seed is refused, naming the field, instead of
silently continuing another stream. The topology it was taken on is recorded but not
checked: restoring under another number of processes or devices continues the same
global batches. So is the count of examples skipped (``on_error="skip"``) by the
process that took the state: a count, not checked, that the restored loader goes on
from.

A schedule in the fingerprint -- a batch size or mixture weights by stage -- is compared
stage by stage instead (a single batch size is a schedule of one stage): a state
restores into a loader whose schedule agrees on every step the state has already taken
(stages appended or changed after it), and is refused, naming the first step that
differs, otherwise. A loader given one batch size takes any state's past instead
(``continued_sizes``): the state's sizes up to its step, the loader's from there on, as
if a stage had been appended at the restored step -- a job restarted on fewer hosts
keeps its per-host batch, and every example of the epoch is still read once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import jax

from meshfeed.core._stages import BatchSizeArg, first_difference, is_stages
from meshfeed.data._sources import FieldSpec, Source
from meshfeed.feed._options import LoaderOptions

STATE_FORMAT = "meshfeed.loader/1"
_DATASET_KEYS = ("num_examples", "fields", "source")


def fingerprint(
    source: Source, fields: Mapping[str, FieldSpec], options: LoaderOptions
) -> dict[str, Any]:
    """What the order of examples depends on, as JSON values."""
    extra = getattr(source, "fingerprint", None)  # e.g. a mixture's weights
    return {
        **({"source": json.loads(json.dumps(extra))} if extra is not None else {}),
        "num_examples": len(source),
        "fields": {n: [list(s.shape), str(s.dtype)] for n, s in fields.items()},
        "seed": options.seed,
        "shuffle": options.shuffle,
        "global_batch_size": (
            options.batch_sizes.stages.to_json() if options.ramp else options.global_batch_size
        ),
        "last_batch": options.last_batch,
        # Only when set, so states from before block shuffles still restore.
        **(
            {"shuffle_block": options.shuffle_block, "shuffle_window": options.window}
            if options.shuffle_block is not None
            else {}
        ),
    }


@dataclasses.dataclass(frozen=True)
class LoaderState:
    """Steps consumed, the fingerprint, and the topology the state was taken on."""

    step: int
    fingerprint: Mapping[str, Any]
    topology: Mapping[str, int]
    skipped: int = 0
    """Examples skipped (``on_error="skip"``) by the process that took the state."""

    @classmethod
    def now(cls, step: int, fingerprint: Mapping[str, Any], skipped: int = 0) -> LoaderState:
        """The state at ``step``, on this process's topology."""
        topology = {"process_count": jax.process_count(), "device_count": jax.device_count()}
        return cls(step, fingerprint, topology, skipped)

    def to_json(self) -> dict[str, Any]:
        """A small JSON-serialisable dict (what ``Loader.state()`` returns)."""
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            **self.fingerprint,
            "topology": dict(self.topology),
            "skipped": self.skipped,
        }

    @classmethod
    def from_json(cls, state: Mapping[str, Any] | str | bytes) -> LoaderState:
        """The state in a dict from ``to_json`` (or its JSON text)."""
        if isinstance(state, str | bytes):
            state = json.loads(state)
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"restore got {type(state).__name__} without format={STATE_FORMAT!r}; pass "
                "the dict returned by Loader.state()."
            )
        rest = {
            k: v for k, v in state.items() if k not in ("format", "step", "topology", "skipped")
        }
        if "fields" in rest:  # JSON turns shape tuples into lists already; keep them lists
            rest["fields"] = {n: [list(s), d] for n, (s, d) in (rest["fields"] or {}).items()}
        skipped = state.get("skipped", 0)
        if not isinstance(skipped, int) or isinstance(skipped, bool) or skipped < 0:
            raise ValueError(f"the state has skipped={skipped!r}; it must be an int >= 0.")
        topology = dict(state.get("topology") or {})
        return cls(state.get("step"), rest, topology, skipped)  # type: ignore[arg-type]

    def check(
        self, mine: Mapping[str, Any], end: int | None, positions: Callable[[int], int]
    ) -> None:
        """Raises unless this state can continue a loader with fingerprint ``mine``,
        ``end`` steps (``None``: endless) and ``positions(k)`` examples read before
        step ``k``."""
        step = self.step
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"the state has step={step!r}; it must be an int >= 0.")
        for key in [*mine, *(k for k in self.fingerprint if k not in mine)]:
            theirs, value = self.fingerprint.get(key), mine.get(key)
            if key == "global_batch_size":
                theirs, value = _as_stages(theirs), _as_stages(value)
            if theirs == value or _past_agrees(key, theirs, value, step):
                continue
            if key == "num_examples" and self._in_order_within(theirs, value, positions(step)):
                continue
            what = "dataset" if key in _DATASET_KEYS else key
            raise ValueError(
                f"the state is from another {what}: {key}={theirs!r} in the state, "
                f"{value!r} in this loader; restore it into a loader built with "
                f"{key}={theirs!r}."
            )
        if end is not None and step > end:
            raise ValueError(
                f"the state is at step {step}, past this loader's {end} steps; raise "
                "num_epochs to continue it."
            )

    def _in_order_within(self, theirs: Any, value: Any, read: int) -> bool:
        """Read in order, a source of another length gives the same steps until the
        shorter one's first epoch ends: the state's past is the same if it ended before."""
        return (
            self.fingerprint.get("shuffle") is False
            and isinstance(theirs, int)
            and isinstance(value, int)
            and read <= min(theirs, value)
        )


def _as_stages(size: Any) -> Any:
    """A fingerprint's batch size as a schedule (one stage for an int); else as it is."""
    if isinstance(size, int) and not isinstance(size, bool):
        return {"stages": [[0, size, 0]]}
    return size


def continued_sizes(state: LoaderState, size: int) -> BatchSizeArg | None:
    """The batch sizes a loader given one ``size`` continues ``state`` with: the state's
    sizes before its step, then ``size`` (a stage appended at the restored step);
    ``None`` where the state says nothing of its batch size (it is then refused or
    restored as before)."""
    theirs = _as_stages(state.fingerprint.get("global_batch_size"))
    if not is_stages(theirs) or not isinstance(state.step, int) or state.step < 0:
        return None
    past = [(int(s[0]), int(s[1])) for s in theirs["stages"] if s[0] < state.step]
    stages = [*past, (state.step, size)]
    return size if all(v == size for _, v in stages) else stages


def _schedules_differ(a: Any, b: Any, path: str) -> list[tuple[str, int | None]]:
    """Where two fingerprint values differ: ``(path, first differing step)`` of each
    schedule that differs, ``(path, None)`` where anything else does."""
    if a == b:
        return []
    if is_stages(a) and is_stages(b):
        return [(path, first_difference(a, b))]
    if isinstance(a, Mapping) and isinstance(b, Mapping) and a.keys() == b.keys():
        return [d for k in a for d in _schedules_differ(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in _schedules_differ(x, y, f"{path}[{i}]")]
    return [(path, None)]


def _past_agrees(key: str, theirs: Any, value: Any, step: int) -> bool:
    """Whether the two differ only in schedules, and only from ``step`` on (raises,
    naming the step, where a schedule differs before it)."""
    found = _schedules_differ(theirs, value, key)
    if not found or any(first is None for _, first in found):
        return False
    path, first = min(found, key=lambda d: d[1])  # type: ignore[arg-type, return-value]
    if first is not None and first < step:
        raise ValueError(
            f"the state is at step {step}, but its schedule {path} differs from this "
            f"loader's from step {first} on, a step already taken; change a schedule only "
            f"after the restored step: keep every stage that starts before step {step} "
            "as it was, and append or change stages from there."
        )
    return True
