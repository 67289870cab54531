"""What a loader did, stage by stage: ``loader.stats()``.

Each stage counts as it goes -- the source's reads (``SourceRows``), the record
transform (``RecordStage``, with the seconds its workers report) and the batch
``transform`` (``StepReader``) in a ``Tally`` each, the consumer in a list of its own
(``Stream.counts``: its ``next()``, the placing on the devices, the read-ahead's fill at
each ask), this process's reads behind URLs in ``storage``'s ``FETCHES`` and its files
opened in ``HANDLES`` (both shared by every source of the process) -- and
``PipelineStats`` reads them all and reports what happened since the loader was built
or since the last ``stats(reset=True)``, as a JSON-able dict.
"""

from __future__ import annotations

import time
from typing import Any

from meshfeed.core._tally import Tally, since
from meshfeed.feed._balanced import BalancedSchedule
from meshfeed.feed._reader import StepReader
from meshfeed.feed._stream import Stream
from meshfeed.storage._handles import HANDLES
from meshfeed.storage._remote import FETCHES

_Raw = dict[str, dict[str, float]]


class PipelineStats:
    """The counts of a loader's stages, from a baseline (``report``)."""

    def __init__(
        self,
        reader: StepReader,
        source: Tally,
        stream: Stream,
        workers: tuple[int, str],
        balanced: BalancedSchedule | None = None,
    ) -> None:
        self._reader = reader
        self._source = source
        self._stream = stream
        self._workers = workers
        self._balanced = balanced
        self._base, self._began = self._raw(), time.perf_counter()

    def _raw(self) -> _Raw:
        records = self._reader.records
        raw = {
            "source": self._source.values(),
            "url": FETCHES.values(),
            "files": {"opened": float(HANDLES.opened)},
            "transform": self._reader.tally.values(),
            "consumer": self._stream.counts(),
        }
        if records is not None:
            raw["record_transform"] = records.counts()
        if self._balanced is not None:
            raw["balance"] = self._balanced.tally.values()
        return raw

    def updates(self) -> int:
        """Adds to the counters so far (what counting costs is per add)."""
        tallies = [self._source, self._reader.tally]
        records = self._reader.records
        if records is not None:
            tallies.append(records.tally)
        return sum(t.updates for t in tallies) + int(self._stream.counts()["steps"])

    def report(self, reset: bool = False) -> dict[str, Any]:
        """Since the baseline: see ``Loader.stats``."""
        now, ended = self._raw(), time.perf_counter()
        d = {name: since(values, self._base.get(name, {})) for name, values in now.items()}
        seconds = ended - self._began
        if reset:
            self._base, self._began = now, ended
        source, consumer = d["source"], d["consumer"]
        asked = consumer["asked"]
        out: dict[str, Any] = {
            "seconds": seconds,
            "steps": int(consumer["steps"]),
            "records_per_s": consumer["records"] / seconds if seconds > 0 else 0.0,
            "source": {
                "reads": int(source["reads"]),
                "records": int(source["records"]),
                "bytes": int(source["bytes"]),
                "seconds": source["seconds"],
                "skipped": int(source["skipped"]),
                "url": {k: int(v) for k, v in d["url"].items()},
                "files": {  # this process's local files (HANDLES, shared by its sources)
                    "opened": int(d["files"]["opened"]),
                    "open": len(HANDLES),
                    "max_open_files": HANDLES.limit(),
                    "held": len(HANDLES.held),
                    "held_bytes": HANDLES.held.bytes,
                },
            },
            "record_transform": None,
            "transform": None,
            "place": {"steps": int(consumer["steps"]), "seconds": consumer["place_seconds"]},
            "consumer": {
                "steps": int(consumer["steps"]),
                "records": int(consumer["records"]),
                "wait_seconds": consumer["wait_seconds"] + consumer["collect_seconds"],
                "wait_read_ahead_seconds": consumer["wait_seconds"],
                "wait_workers_seconds": consumer["collect_seconds"],
                "next_seconds": consumer["next_seconds"],
                "read_ahead": {
                    "depth": self._stream.depth,
                    "threads": self._stream.threads,
                    "moves": self._stream.moves,
                    "ready_share": consumer["ready"] / asked if asked else None,
                    "steps_ready": consumer["steps_ready"] / asked if asked else None,
                    "fill": consumer["fill"] / asked if asked else None,
                    "peak_bytes": self._stream.peak_bytes,
                },
            },
            "counter_updates": self.updates(),
        }
        if "record_transform" in d:
            records = d["record_transform"]
            out["record_transform"] = {
                "records": int(records["records"]),
                "seconds": records["seconds"],
                "skipped": int(records["skipped"]),
                "filtered": int(records["filtered"]),
                "workers": self._workers[0],
                "worker_type": self._workers[1],
                "lent": self._reader.records.lent() if self._reader.records else 0,
            }
            decoder = (
                getattr(self._reader.records.fn, "decoder", None) if self._reader.records else None
            )
            if isinstance(decoder, str):  # meshfeed.vision's: which decoder ran
                out["record_transform"]["decoder"] = decoder
        if self._reader.has_transform:
            calls, spent = d["transform"]["calls"], d["transform"]["seconds"]
            out["transform"] = {"calls": int(calls), "seconds": spent}
        if self._balanced is not None:  # steps of even cost, dealt to the devices
            dealt = d["balance"]
            out["balance"] = {
                "steps": int(dealt["steps"]),
                "devices": self._balanced.devices,
                "imbalance": dealt["imbalance"] / dealt["steps"] if dealt["steps"] else None,
                "last_imbalance": self._balanced.last_imbalance,
            }
        return out
