"""Workload E2: the default read-ahead behind a source whose reads sleep ``--latencies`` ms,
an MLP trained by ``fit``, against a fixed depth good for the latency, in fresh processes."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import jax
import numpy as np
import optax
from harness import arguments, emit, use_cpu_devices
from remote_fns import in_child, loader

import meshfeed
from common import Remote, digits

WARMUP, STEPS, BATCH = 50, 400, 64
FIXED = {2.0: 2, 20.0: 16}  # the peer: a fixed depth good for the latency


def child(latency_ms: float, prefetch: str, steps: int, warmup: int) -> dict[str, Any]:
    """One process's run: the input wait over the steps after ``warmup``."""
    use_cpu_devices()
    data = digits()
    flat = meshfeed.ArraySource({"x": data["image"].reshape(-1, 64), "y": data["label"]})
    depth = "auto" if prefetch == "auto" else int(prefetch)
    fed = loader(Remote(flat, latency_ms / 1000), BATCH, prefetch=depth)
    rng = np.random.default_rng(0)
    params = {
        "w1": (rng.normal(size=(64, 256)) * 0.1).astype(np.float32),
        "b1": np.zeros(256, np.float32),
        "w2": (rng.normal(size=(256, 10)) * 0.1).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }

    def loss(p: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
        logits = jax.nn.relu(batch["x"] @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        return meshfeed.masked_mean(losses, batch), {}

    mesh = meshfeed.make_mesh(data=8)
    optimizer = optax.adam(1e-3)
    state = meshfeed.TrainState.create(params, optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss, optimizer, mesh=mesh)
    history = meshfeed.fit(
        step, state, fed, num_steps=warmup + steps, log_every=warmup, progress=False
    )

    def waited_and_spent(k: int) -> tuple[float, float]:  # fit's log is cumulative
        logged = history.train[k // warmup - 1]
        spent = BATCH * k / logged["samples_per_s"]
        return logged["input_wait_share"] * spent, spent

    (w0, t0), (w1, t1) = waited_and_spent(warmup), waited_and_spent(warmup + steps)
    moves = fed.stats()["consumer"]["read_ahead"]["moves"]
    fed.close()
    return {
        "input_wait_share": (w1 - w0) / (t1 - t0),
        "steps_per_s": steps / (t1 - t0),
        "depth": fed.prefetch_depth,
        "trials": sum(m["why"].startswith("trial") for m in moves),
        "moves": moves,
        "jax": jax.__version__,
    }


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", type=int, default=5, help="fresh processes a contender")
    parser.add_argument("--latencies", default="2,20", help="ms a read sleeps, comma-separated")


def main() -> None:
    args = arguments(__doc__, add=_flags)
    steps, warmup = (20, 10) if args.smoke else (STEPS, WARMUP)
    processes = 1 if args.smoke else args.processes
    latencies = args.latencies.split(",")[: 1 if args.smoke else None]
    # "processes": the fresh processes a contender, each with 8 devices.
    head = {"workload": "E2", "smoke": args.smoke, "devices": 8, "processes": processes}
    for latency in map(float, latencies):
        contenders = ["auto", str(FIXED.get(latency, 2))]
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
        for r in range(processes):
            for prefetch in contenders[r % 2 :] + contenders[: r % 2]:
                run = in_child(child, latency, prefetch, steps, warmup)
                runs[prefetch].append(run)
                line = {"latency_ms": latency, "prefetch": prefetch, "round": r}
                line |= {k: round(v, 4) if isinstance(v, float) else v for k, v in run.items()}
                emit("slow_source", name="process", **head, **line)
        auto, fixed = runs["auto"], runs[contenders[1]]
        waits = {k: [round(r["input_wait_share"], 4) for r in runs[k]] for k in contenders}
        ratios = [a["steps_per_s"] / f["steps_per_s"] for a, f in zip(auto, fixed, strict=True)]
        emit(
            "slow_source",
            name=f"summary:{latency:g}ms",
            **head,
            latency_ms=latency,
            input_wait_share={"auto": waits["auto"], "max": max(waits["auto"])},
            fixed={"prefetch": int(contenders[1]), "input_wait_share": waits[contenders[1]]},
            steps_per_s_to_fixed=round(statistics.median(ratios), 3),
            depths=[r["depth"] for r in auto],
            steps=steps,
            global_batch_size=BATCH,
            jax=auto[0]["jax"],
        )


if __name__ == "__main__":
    main()
