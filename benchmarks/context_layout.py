"""What a context layout costs on the host and saves each device's reads.

Workload Z: documents of log-uniform lengths (64 .. 2·T tokens, int32), packed into rows
of T = 8,192 and 32,768 tokens (``max_segments=256, seq_lens=True``), laid out by
``meshfeed.sources.context_layout`` over cp = 4 and 8 (``data = 8 / cp``), batch
``2 · 8 / cp`` rows. Three figures a setting:

- ``bytes``: what one device reads of a row with ``strategy="per_device"`` under
  ``P("data", "context")`` (``loader.stats()``'s source bytes over its records), against
  a whole row's; and the documents' tokens the packed source read for it, against a
  whole row's (``per_process``; a document crossing a slice boundary is read whole).
- ``host``: microseconds a row to read rows laid out (``laid_out[ids]``) against rows as
  packed (``rows[ids]``), and to read one device's slice (``read_at``), rotating rounds,
  median of per-round ratios.

Prints one JSON line per measurement; ``--smoke`` for CI (T = 1,024, one round).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import meshfeed  # noqa: E402


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
    split, whole = NamedSharding(mesh, P("data", "context")), NamedSharding(mesh, P("data"))
    sharding = {name: split for name in ("tokens", "segment_ids", "positions")}
    sharding |= {"seq_lens": whole, "seq_starts": whole}
    out = {}
    for strategy in ("per_device", "per_process"):
        counted.tokens = 0
        loader = meshfeed.Loader(laid_out, global_batch_size=batch, sharding=sharding,
                                 strategy=strategy, shuffle=False, num_epochs=None)  # fmt: skip
        with loader:
            for _, _ in zip(range(steps), loader, strict=False):
                pass
            read = loader.stats()["source"]  # read-ahead included: per record, below
        out[strategy] = (read["bytes"] / read["records"], counted.tokens / read["records"])
    row_bytes = sum(
        int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in laid_out.fields.values()
    )
    (cut_bytes, cut_tokens), (_, whole_tokens) = out["per_device"], out["per_process"]
    print(json.dumps({
        "benchmark": "context_layout", "part": "bytes", "tokens": seq_len, "cp": cp,
        "data": data, "row_bytes": row_bytes, "device_bytes_per_row": round(cut_bytes),
        "device_over_row": round(cut_bytes / row_bytes, 4),
        "document_tokens_per_device_row": round(cut_tokens),
        "document_tokens_per_row": round(whole_tokens),
        "documents_device_over_row": round(cut_tokens / max(1.0, whole_tokens), 4),
        "smoke": smoke,
    }), flush=True)  # fmt: skip


def host(seq_len: int, cp: int, rounds: int, smoke: bool) -> None:
    rows = meshfeed.pack(documents(seq_len, seq_len * 64, seed=1), seq_len, max_segments=256)
    laid_out = meshfeed.sources.context_layout(rows, cp)
    ids = np.arange(min(16, len(rows)))
    at = np.arange(seq_len // cp)  # device 0's slice of the laid-out row
    contenders = {
        "packed": lambda: rows[ids],
        "laid_out": lambda: laid_out[ids],
        "device_slice": lambda: laid_out.read_at(ids, at),
    }
    window = 0.05 if smoke else 0.3
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        names = list(contenders)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run, done, began = contenders[name], 0, time.perf_counter()
            while time.perf_counter() - began < window:
                run()
                done += 1
            seconds[name].append((time.perf_counter() - began) / (done * len(ids)))
    per_row = {name: float(np.median(s)) * 1e6 for name, s in seconds.items()}
    ratio = np.median(np.asarray(seconds["laid_out"]) / np.asarray(seconds["packed"]))
    print(json.dumps({
        "benchmark": "context_layout", "part": "host", "tokens": seq_len, "cp": cp,
        "rounds": rounds, "packed_us_per_row": round(per_row["packed"], 1),
        "laid_out_us_per_row": round(per_row["laid_out"], 1),
        "device_slice_us_per_row": round(per_row["device_slice"], 1),
        "laid_out_over_packed": round(float(ratio), 3), "smoke": smoke,
    }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="T = 1,024, one round")
    args = parser.parse_args()
    lengths = [1024] if args.smoke else [8192, 32768]
    for seq_len in lengths:
        for cp in (4, 8):
            reads(seq_len, cp, steps=2 if args.smoke else 6, smoke=args.smoke)
            host(seq_len, cp, rounds=1 if args.smoke else 5, smoke=args.smoke)


if __name__ == "__main__":
    main()
