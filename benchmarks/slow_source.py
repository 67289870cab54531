"""The default read-ahead behind a source that is slow but not very slow, in fresh processes.

Workload E2: scikit-learn's digits (flattened) in an ``ArraySource``, wrapped in a source
whose every read sleeps ``--latencies`` ms (a local database, an NFS mount, a small
object store, seen from the loader); a small MLP (64-256-10, ~2 ms a step here) trained
by ``meshfeed.fit`` on 8 CPU devices, global batch 64, every ``Loader`` default as it
is. Each run is a fresh process (the read-ahead starts from nothing, as in a user's
job), and measures the input wait (``fit``'s: devices idle while the loop waited for
the next batch) over steps 51-450, after 50 of warm-up.

Against it, in the same rotating rounds, a fixed depth: ``prefetch=2`` behind 2 ms
(the best fixed depth there) and ``prefetch=16`` behind 20 ms. Goal: the default's
input wait <= 2% in every process, at both latencies.

Prints one JSON line per process and a summary per latency; ``--smoke`` for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WARMUP, STEPS, BATCH = 50, 400, 64
FIXED = {2.0: 2, 20.0: 16}  # the peer: a fixed depth good for the latency


def child(latency_ms: float, prefetch: str, steps: int, warmup: int) -> dict[str, Any]:
    """One process's run: the input wait over the steps after ``warmup``."""
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np
    import optax

    import meshfeed
    from common import Remote, digits

    data = digits()
    flat = {"x": data["image"].reshape(len(data["image"]), -1), "y": data["label"]}
    mesh = meshfeed.make_mesh(data=8)
    loader = meshfeed.Loader(
        Remote(meshfeed.ArraySource(flat), latency_ms / 1000),
        global_batch_size=BATCH,
        sharding=meshfeed.batch_sharding(mesh),
        num_epochs=None,
        prefetch="auto" if prefetch == "auto" else int(prefetch),
    )
    rng = np.random.default_rng(0)
    params = {
        "w1": (rng.normal(size=(64, 256)) * 0.1).astype(np.float32),
        "b1": np.zeros(256, np.float32),
        "w2": (rng.normal(size=(256, 10)) * 0.1).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }

    def loss(p: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
        hidden = jax.nn.relu(batch["x"] @ p["w1"] + p["b1"])
        logits = hidden @ p["w2"] + p["b2"]
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        return meshfeed.masked_mean(losses, batch), {}

    optimizer = optax.adam(1e-3)
    state = meshfeed.TrainState.create(params, optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss, optimizer, mesh=mesh)
    history = meshfeed.fit(
        step, state, loader, num_steps=warmup + steps, log_every=warmup, progress=False
    )

    def waited_and_spent(k: int) -> tuple[float, float]:  # fit's log is cumulative
        logged = history.train[k // warmup - 1]
        spent = BATCH * k / logged["samples_per_s"]
        return logged["input_wait_share"] * spent, spent

    (w0, t0), (w1, t1) = waited_and_spent(warmup), waited_and_spent(warmup + steps)
    moves = loader.stats()["consumer"]["read_ahead"]["moves"]
    loader.close()
    return {
        "input_wait_share": (w1 - w0) / (t1 - t0),
        "steps_per_s": steps / (t1 - t0),
        "depth": loader.prefetch_depth,
        "trials": sum(m["why"].startswith("trial") for m in moves),
        "moves": moves,
        "jax": jax.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one short process each, for CI")
    parser.add_argument("--processes", type=int, default=5, help="fresh processes a contender")
    parser.add_argument("--latencies", default="2,20", help="ms a read sleeps, comma-separated")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps, warmup = (20, 10) if args.smoke else (STEPS, WARMUP)
    if args.child:
        latency, prefetch = args.child.split(":")
        print(json.dumps(child(float(latency), prefetch, steps, warmup)), flush=True)
        return
    processes = 1 if args.smoke else args.processes
    latencies = args.latencies.split(",")[:1] if args.smoke else args.latencies.split(",")
    for latency in (float(x) for x in latencies):
        contenders = ["auto", str(FIXED.get(latency, 2))]
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
        for round_ in range(processes):
            for prefetch in contenders[round_ % 2 :] + contenders[: round_ % 2]:
                command = [sys.executable, __file__, "--child", f"{latency}:{prefetch}"]
                if args.smoke:
                    command.append("--smoke")
                out = subprocess.run(command, cwd=HERE, capture_output=True, text=True)
                if out.returncode:
                    sys.exit(out.stderr)
                run = json.loads(out.stdout.strip().splitlines()[-1])
                runs[prefetch].append(run)
                line = {"benchmark": "slow_source", "workload": "E2", "name": "process"}
                line |= {"latency_ms": latency, "prefetch": prefetch, "round": round_}
                line |= {k: round(v, 4) if isinstance(v, float) else v for k, v in run.items()}
                print(json.dumps(line | {"smoke": args.smoke}), flush=True)
        auto, fixed = runs["auto"], runs[contenders[1]]
        waits = [round(r["input_wait_share"], 4) for r in auto]
        ratios = [a["steps_per_s"] / f["steps_per_s"] for a, f in zip(auto, fixed, strict=True)]
        summary = {
            "benchmark": "slow_source",
            "workload": "E2",
            "name": f"summary:{latency:g}ms",
            "latency_ms": latency,
            "processes": processes,
            "input_wait_share": {"auto": waits, "max": max(waits)},
            "fixed": {
                "prefetch": int(contenders[1]),
                "input_wait_share": [round(r["input_wait_share"], 4) for r in fixed],
            },
            "steps_per_s_to_fixed": round(statistics.median(ratios), 3),
            "depths": [r["depth"] for r in auto],
            "steps": steps,
            "global_batch_size": BATCH,
            "smoke": args.smoke,
            "jax": auto[0]["jax"],
            "python": platform.python_version(),
        }
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
