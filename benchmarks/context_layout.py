"""What a context layout costs on the host and saves each device's reads (workload Z:
``meshfeed.sources.context_layout`` over cp = 4 and 8 on 8 CPU devices).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from attention import seconds_per_call
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from packing import source

import meshfeed


class Counted:
    """A source that counts the document tokens read from it."""

    def __init__(self, source: Any) -> None:
        self.source, self.tokens = source, 0
        self.fields, self.lengths = source.fields, source.lengths

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, ids: Any) -> Any:
        out = self.source[ids]
        self.tokens += int(out["tokens"].lengths.sum())
        return out


def documents(seq_len: int, tokens: int, seed: int = 0) -> meshfeed.ArraySource:
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(np.exp(rng.uniform(np.log(64), np.log(2 * seq_len)))))
    return source(np.array(lengths), rng.integers(1, 50_000, sum(lengths), dtype=np.int32))


def reads(seq_len: int, cp: int, steps: int) -> dict[str, Any]:
    """Bytes and document tokens a row of what one device reads (``per_device``) against
    those of whole rows (``per_process``: a document crossing a slice is read whole)."""
    data = 8 // cp
    batch = 2 * data
    counted = Counted(documents(seq_len, seq_len * batch * (steps + 2)))
    rows = meshfeed.pack(counted, seq_len, max_segments=256, seq_lens=True)
    laid_out = meshfeed.sources.context_layout(rows, cp)
    mesh = meshfeed.make_mesh(data=data, context=cp)
    split, whole = NamedSharding(mesh, P("data", "context")), NamedSharding(mesh, P("data"))
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
    (cut_bytes, cut_tokens), whole_tokens = out["per_device"], out["per_process"][1]
    return {
        "data": data,
        "row_bytes": row_bytes,
        "device_bytes_per_row": round(cut_bytes),
        "device_over_row": round(cut_bytes / row_bytes, 4),
        "document_tokens_per_device_row": round(cut_tokens),
        "document_tokens_per_row": round(whole_tokens),
        "documents_device_over_row": round(cut_tokens / max(1.0, whole_tokens), 4),
    }


def host(seq_len: int, cp: int, rounds: int, window: float) -> dict[str, Any]:
    """Microseconds a row to read rows laid out, and device 0's slice, against as packed."""
    rows = meshfeed.pack(documents(seq_len, seq_len * 64, seed=1), seq_len, max_segments=256)
    laid_out = meshfeed.sources.context_layout(rows, cp)
    ids = np.arange(min(16, len(rows)))
    at = np.arange(seq_len // cp)  # device 0's slice of the laid-out row
    reads = {
        "packed": lambda: rows[ids],
        "laid_out": lambda: laid_out[ids],
        "device_slice": lambda: laid_out.read_at(ids, at),
    }
    entries = {name: functools.partial(seconds_per_call, r, window) for name, r in reads.items()}
    per_round = in_rounds(entries, rounds, pause=0.0)
    us = {
        f"{n}_us_per_row": round((median_of(per_round, n) or 0.0) * 1e6 / len(ids), 1)
        for n in reads
    }
    ratio = median_ratio(per_round, "laid_out", "packed")
    return {"rounds": rounds, **us, "laid_out_over_packed": ratio}


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=5)
    for seq_len in [1024] if args.smoke else [8192, 32768]:
        for cp in (4, 8):
            at = {"smoke": args.smoke, "tokens": seq_len, "cp": cp}
            emit("context_layout", part="bytes", **at, **reads(seq_len, cp, 2 if args.smoke else 6))
            window = 0.05 if args.smoke else 0.3
            emit("context_layout", part="host", **at, **host(seq_len, cp, args.rounds, window))


if __name__ == "__main__":
    main()
