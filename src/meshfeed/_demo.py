"""The demo: scikit-learn's handwritten digits fed to 2 processes x 4 CPU devices.

Each process loads only the rows of each global batch that its devices hold; the demo
checks that one epoch covers every example exactly once across processes and that the
four strategies deliver the same bytes.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from meshfeed._strategies import STRATEGIES, Strategy

GLOBAL_BATCH_SIZE = 64


def _digits() -> dict[str, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the demo reads scikit-learn's digits; pip install 'meshfeed[demo]'."
        ) from e
    digits: Any = load_digits()
    return {
        "image": (np.asarray(digits.images) / 16.0).astype(np.float32)[..., None],
        "label": np.asarray(digits.target).astype(np.int32),
    }


def _epoch(strategy: Strategy) -> dict[str, Any]:
    """One padded epoch in this process; what it read and a digest of what it got."""
    import jax

    import meshfeed
    from meshfeed.testing import local_shards

    arrays = _digits()
    source = _CountingSource(meshfeed.ArraySource(arrays))
    mesh = meshfeed.make_mesh(data=jax.device_count())
    loader = meshfeed.Loader(
        source,
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=meshfeed.batch_sharding(mesh),
        strategy=strategy,
        last_batch="pad",
        seed=0,
    )
    digest = hashlib.sha256()
    seen: list[int] = []
    for step, batch in enumerate(loader):
        if strategy == "reshard":
            batch = meshfeed.reshard(batch, loader.sharding)
        for name in sorted(batch):
            for _, data in local_shards(batch[name]):
                digest.update(data.tobytes())
        for index, mask in local_shards(batch["mask"]):
            ids = loader.ids(step)[index]
            seen.extend(ids[mask].tolist())
    label = strategy if strategy == loader.strategy else f"{strategy} -> {loader.strategy}"
    return {
        "process": jax.process_index(),
        "strategy": label,
        "steps": len(loader),
        "read": source.count,
        "seen": sorted(set(seen)),
        "digest": digest.hexdigest()[:6],
        "examples": len(source),
    }


class _CountingSource:
    """Counts the rows a process reads."""

    def __init__(self, source: Any) -> None:
        self.source, self.count = source, 0
        self.fields = source.fields

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        self.count += len(ids)
        return self.source[ids]


def _all_strategies() -> list[dict[str, Any]]:
    return [_epoch(s) for s in STRATEGIES]


def run_demo(*, num_processes: int = 2, devices_per_process: int = 4) -> bool:
    """Runs the demo and prints what each process did. Returns True when all checks pass."""
    from meshfeed.testing import run_in_processes

    console = Console()
    console.print(
        f"[bold]meshfeed demo[/]: scikit-learn digits on {num_processes} processes x "
        f"{devices_per_process} CPU devices, mesh data={num_processes * devices_per_process}, "
        f"P('data'), global_batch_size={GLOBAL_BATCH_SIZE}, last_batch='pad'"
    )
    results = run_in_processes(
        _all_strategies, num_processes=num_processes, devices_per_process=devices_per_process
    )
    table = Table("strategy", "steps", "rows read by each process", "examples seen", "digest")
    ok = True
    reference = None
    for i, name in enumerate(r["strategy"] for r in results[0]):
        per_process = [results[p][i] for p in range(num_processes)]
        seen = [x for r in per_process for x in r["seen"]]
        covered = sorted(seen) == list(range(per_process[0]["examples"]))
        digest = "/".join(r["digest"] for r in per_process)
        reference = reference or digest
        ok = ok and covered and digest == reference
        table.add_row(
            name,
            str(per_process[0]["steps"]),
            " / ".join(str(r["read"]) for r in per_process),
            f"{len(seen)}, each once" if covered else "WRONG",
            digest + ("" if digest == reference else " DIFFERS"),
        )
    console.print(table)
    console.print(
        "every strategy delivered the same bytes and one epoch covered every example once"
        if ok
        else "[red]a check failed[/]"
    )
    return ok
