"""A loader's state: the steps consumed, and what the order of examples depends on.

Every process derives the schedule on its own from the source's length, the seed, the
shuffle, the global batch size and ``last_batch``, so a position in the stream is one
number. The state carries those inputs too (the *fingerprint*), so a state restored into
a loader over other data or with another seed is refused, naming the field, instead of
silently continuing another stream. The topology it was taken on is recorded but not
checked: restoring under another number of processes or devices continues the same
global batches.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import jax

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
        "global_batch_size": options.global_batch_size,
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

    @classmethod
    def now(cls, step: int, fingerprint: Mapping[str, Any]) -> LoaderState:
        """The state at ``step``, on this process's topology."""
        topology = {"process_count": jax.process_count(), "device_count": jax.device_count()}
        return cls(step, fingerprint, topology)

    def to_json(self) -> dict[str, Any]:
        """A small JSON-serialisable dict (what ``Loader.state()`` returns)."""
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            **self.fingerprint,
            "topology": dict(self.topology),
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
        rest = {k: v for k, v in state.items() if k not in ("format", "step", "topology")}
        if "fields" in rest:  # JSON turns shape tuples into lists already; keep them lists
            rest["fields"] = {n: [list(s), d] for n, (s, d) in (rest["fields"] or {}).items()}
        return cls(state.get("step"), rest, dict(state.get("topology") or {}))  # type: ignore[arg-type]

    def check(self, mine: Mapping[str, Any], end: int | None) -> None:
        """Raises unless this state can continue a loader with fingerprint ``mine``
        and ``end`` steps (``None``: endless)."""
        for key in [*mine, *(k for k in self.fingerprint if k not in mine)]:
            theirs, value = self.fingerprint.get(key), mine.get(key)
            if theirs != value:
                what = "dataset" if key in _DATASET_KEYS else key
                raise ValueError(
                    f"the state is from another {what}: {key}={theirs!r} in the state, "
                    f"{value!r} in this loader; restore it into a loader built with "
                    f"{key}={theirs!r}."
                )
        step = self.step
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"the state has step={step!r}; it must be an int >= 0.")
        if end is not None and step > end:
            raise ValueError(
                f"the state is at step {step}, past this loader's {end} steps; raise "
                "num_epochs to continue it."
            )
