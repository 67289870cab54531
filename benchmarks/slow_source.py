"""The default read-ahead behind a source that is slow but not very slow, in fresh processes.

Workload E2: the digits behind reads that sleep ``--latencies`` ms, an MLP trained by
``fit``; the default's input wait over steps 51-450 against a fixed depth good for the
latency, rotating rounds of fresh processes. Goal: input wait <= 2% in every process.
``--smoke`` for CI; the workload is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from harness import arguments, emit, run_child, use_cpu_devices

WARMUP, STEPS, BATCH = 50, 400, 64
FIXED = {2.0: 2, 20.0: 16}  # the peer: a fixed depth good for the latency


def child(latency_ms: float, prefetch: str, steps: int, warmup: int) -> dict[str, Any]:
    """One process's run: the input wait over the steps after ``warmup``."""
    use_cpu_devices()
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


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", type=int, default=5, help="fresh processes a contender")
    parser.add_argument("--latencies", default="2,20", help="ms a read sleeps, comma-separated")
    parser.add_argument("--child", help=argparse.SUPPRESS)


def main() -> None:
    args = arguments(__doc__, add=_flags)
    steps, warmup = (20, 10) if args.smoke else (STEPS, WARMUP)
    if args.child:
        latency, prefetch = args.child.split(":")
        print(json.dumps(child(float(latency), prefetch, steps, warmup)), flush=True)
        return
    processes = 1 if args.smoke else args.processes
    latencies = args.latencies.split(",")[:1] if args.smoke else args.latencies.split(",")
    # "processes": the fresh processes a contender, each with 8 devices.
    head = {"workload": "E2", "smoke": args.smoke, "devices": 8, "processes": processes}
    for latency in (float(x) for x in latencies):
        contenders = ["auto", str(FIXED.get(latency, 2))]
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
        for round_ in range(processes):
            for prefetch in contenders[round_ % 2 :] + contenders[: round_ % 2]:
                command = [__file__, "--child", f"{latency}:{prefetch}"]
                run = run_child([*command, "--smoke"] if args.smoke else command)
                runs[prefetch].append(run)
                line = {"latency_ms": latency, "prefetch": prefetch, "round": round_}
                line |= {k: round(v, 4) if isinstance(v, float) else v for k, v in run.items()}
                emit("slow_source", name="process", **head, **line)
        auto, fixed = runs["auto"], runs[contenders[1]]
        waits = [round(r["input_wait_share"], 4) for r in auto]
        ratios = [a["steps_per_s"] / f["steps_per_s"] for a, f in zip(auto, fixed, strict=True)]
        emit(
            "slow_source",
            name=f"summary:{latency:g}ms",
            **head,
            latency_ms=latency,
            input_wait_share={"auto": waits, "max": max(waits)},
            fixed={
                "prefetch": int(contenders[1]),
                "input_wait_share": [round(r["input_wait_share"], 4) for r in fixed],
            },
            steps_per_s_to_fixed=round(statistics.median(ratios), 3),
            depths=[r["depth"] for r in auto],
            steps=steps,
            global_batch_size=BATCH,
            jax=auto[0]["jax"],
        )


if __name__ == "__main__":
    main()
