"""Workload E2: the default read-ahead behind slow reads, against a fixed depth good for them."""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import jax
import numpy as np
import optax
from harness import arguments, emit, in_rounds, median_ratio
from remote_fns import in_child, loader

import meshfeed
from common import Remote, digits

WARMUP, STEPS, BATCH = 50, 400, 64
FIXED = {2.0: 2, 20.0: 16}  # the peer: a fixed depth good for the latency


def child(latency_ms: float, prefetch: str, steps: int, warmup: int) -> dict[str, Any]:
    """One process's run: the input wait over the steps after ``warmup``."""
    data = digits()
    flat = meshfeed.ArraySource({"x": data["image"].reshape(-1, 64), "y": data["label"]})
    depth = "auto" if prefetch == "auto" else int(prefetch)
    fed = loader(Remote(flat, latency_ms / 1000), BATCH, prefetch=depth)
    rng = np.random.default_rng(0)
    shapes = {"1": (64, 256), "2": (256, 10)}
    params = {f"w{k}": (rng.normal(size=s) * 0.1).astype(np.float32) for k, s in shapes.items()}
    params |= {f"b{k}": np.zeros(s[1], np.float32) for k, s in shapes.items()}

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
    }


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", type=int, default=5, help="fresh processes a contender")
    parser.add_argument("--latencies", default="2,20", help="ms a read sleeps, comma-separated")


def main() -> None:
    args = arguments(__doc__, smoke={"processes": 1}, add=_flags)
    steps, warmup = (20, 10) if args.smoke else (STEPS, WARMUP)
    latencies = args.latencies.split(",")[: 1 if args.smoke else None]
    # "processes": the fresh processes a contender, each with 8 devices.
    head = {"workload": "E2", "smoke": args.smoke, "devices": 8, "processes": args.processes}
    for latency in map(float, latencies):
        fixed = str(FIXED.get(latency, 2))
        entries = {c: partial(in_child, child, latency, c, steps, warmup) for c in ("auto", fixed)}
        per_round = in_rounds(entries, args.processes, pause=0.0)
        for r, runs in enumerate(per_round):
            for prefetch, run in runs.items():
                line = {"latency_ms": latency, "prefetch": prefetch, "round": r}
                line |= {k: round(v, 4) if isinstance(v, float) else v for k, v in run.items()}
                emit("slow_source", name="process", **head, **line)
        waits = {k: [round(r[k]["input_wait_share"], 4) for r in per_round] for k in entries}
        emit(
            "slow_source",
            name=f"summary:{latency:g}ms",
            **head,
            latency_ms=latency,
            input_wait_share={"auto": waits["auto"], "max": max(waits["auto"])},
            fixed={"prefetch": int(fixed), "input_wait_share": waits[fixed]},
            steps_per_s_to_fixed=median_ratio(per_round, "auto", fixed, "steps_per_s"),
            depths=[r["auto"]["depth"] for r in per_round],
            steps=steps,
            global_batch_size=BATCH,
        )


if __name__ == "__main__":
    main()
