"""What a context layout costs on the host and saves each device's reads.

Workload Z: documents of log-uniform lengths (64 .. 2T tokens) packed into rows of T =
8,192 and 32,768 (``max_segments=256, seq_lens=True``), laid out by
``meshfeed.sources.context_layout`` over cp = 4 and 8 on 8 CPU devices. ``bytes``: what
one device reads of a row with ``strategy="per_device"`` under ``P("data", "context")``
against a whole row's, and the documents' tokens read for it (``per_process``: a
document crossing a slice is read whole); ``host``: microseconds a row to read rows laid
out, and one device's slice, against rows as packed (rotating rounds, the median of the
per-round ratios). ``--smoke`` for CI (T = 1,024, one round).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed


class Counted:
    """A source that counts the document tokens read from it."""

    def __init__(self, source: Any) -> None:
        self.source, self.tokens = source, 0

    @property
    def fields(self) -> Any:
        return self.source.fields

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, ids: Any) -> Any:
        out = self.source[ids]
        self.tokens += int(out["tokens"].lengths.sum())
        return out

    def lengths(self, field: str) -> np.ndarray:
        return self.source.lengths(field)


def documents(seq_len: int, tokens: int, seed: int = 0) -> meshfeed.ArraySource:
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(np.exp(rng.uniform(np.log(64), np.log(2 * seq_len)))))
    values = rng.integers(1, 50_000, sum(lengths), dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return meshfeed.ArraySource({"tokens": meshfeed.Ragged(values, offsets)})


def reads(seq_len: int, cp: int, steps: int, smoke: bool) -> None:
    data = 8 // cp
    batch = 2 * data
    counted = Counted(documents(seq_len, seq_len * batch * (steps + 2)))
    rows = meshfeed.pack(counted, seq_len, max_segments=256, seq_lens=True)
    laid_out = meshfeed.sources.context_layout(rows, cp)
    mesh = meshfeed.make_mesh(data=data, context=cp)
    split = NamedSharding(mesh, P("data", "context"))
    whole = NamedSharding(mesh, P("data"))
    sharding = {name: split for name in ("tokens", "segment_ids", "positions")}
    sharding |= {"seq_lens": whole, "seq_starts": whole}
    options: dict[str, Any] = {"sharding": sharding, "shuffle": False, "num_epochs": None}
    out = {}
    for strategy in ("per_device", "per_process"):
        counted.tokens = 0
        loader = meshfeed.Loader(laid_out, global_batch_size=batch, strategy=strategy, **options)
        with loader:
            for _, _ in zip(range(steps), loader, strict=False):
                pass
            read = loader.stats()["source"]  # read-ahead included: per record, below
        out[strategy] = (read["bytes"] / read["records"], counted.tokens / read["records"])
    row_bytes = sum(
        int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in laid_out.fields.values()
    )
    cut_bytes, cut_tokens = out["per_device"]
    whole_tokens = out["per_process"][1]
    emit(
        "context_layout",
        smoke=smoke,
        part="bytes",
        tokens=seq_len,
        cp=cp,
        data=data,
        row_bytes=row_bytes,
        device_bytes_per_row=round(cut_bytes),
        device_over_row=round(cut_bytes / row_bytes, 4),
        document_tokens_per_device_row=round(cut_tokens),
        document_tokens_per_row=round(whole_tokens),
        documents_device_over_row=round(cut_tokens / max(1.0, whole_tokens), 4),
    )


def _seconds_per_row(read: Callable[[], Any], rows: int, window: float) -> float:
    done = 0
    began = time.perf_counter()
    while time.perf_counter() - began < window:
        read()
        done += 1
    return (time.perf_counter() - began) / (done * rows)


def host(seq_len: int, cp: int, rounds: int, smoke: bool) -> None:
    rows = meshfeed.pack(documents(seq_len, seq_len * 64, seed=1), seq_len, max_segments=256)
    laid_out = meshfeed.sources.context_layout(rows, cp)
    ids = np.arange(min(16, len(rows)))
    at = np.arange(seq_len // cp)  # device 0's slice of the laid-out row
    reads = {
        "packed": lambda: rows[ids],
        "laid_out": lambda: laid_out[ids],
        "device_slice": lambda: laid_out.read_at(ids, at),
    }
    window = 0.05 if smoke else 0.3
    entries = {
        name: lambda read=read: _seconds_per_row(read, len(ids), window)
        for name, read in reads.items()
    }
    per_round = in_rounds(entries, rounds, pause=0.0)
    us = {name: round((median_of(per_round, name) or 0.0) * 1e6, 1) for name in reads}
    emit(
        "context_layout",
        smoke=smoke,
        part="host",
        tokens=seq_len,
        cp=cp,
        rounds=rounds,
        packed_us_per_row=us["packed"],
        laid_out_us_per_row=us["laid_out"],
        device_slice_us_per_row=us["device_slice"],
        laid_out_over_packed=median_ratio(per_round, "laid_out", "packed"),
    )


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=5)
    for seq_len in [1024] if args.smoke else [8192, 32768]:
        for cp in (4, 8):
            reads(seq_len, cp, steps=2 if args.smoke else 6, smoke=args.smoke)
            host(seq_len, cp, rounds=args.rounds, smoke=args.smoke)


if __name__ == "__main__":
    main()
