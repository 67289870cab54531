"""Training at real size: a device's memory for the state, donated and sharded; saves that
run on while training goes on.

Part ``memory``: an MLP of ~100M parameters (3 blocks of 2048 -> 8192 -> 2048, Adam) on
8 CPU devices, data parallel, global batch 64. Its step (``make_train_step``,
``mode="jit"``) is lowered for abstract states -- nothing is allocated but the FSDP
state the layouts come from -- and compiled; per device: the state's bytes and
``compiled.memory_analysis()`` (arguments, outputs, what the donation reuses, the
temporaries, and their sum less the reuse: the step's peak). Three ways: replicated
without donation (what a step cost before), replicated and donated, FSDP
(``param_sharding="fsdp"``) and donated.

Part ``microbatches``: a model whose activations dominate (rows of 512 tokens through
2 residual MLP blocks of 256 -> 2048 -> 256: 2.4M parameters, 27 MB of state and
~500 MB of temporaries a device at 16 rows a device), its jit step with
``microbatches`` 1, 2 and 4, lowered and compiled as above: the step's peak a device
and its temporaries, and their ratio to the unsplit step's (the same update:
``tests/test_microbatches.py``).

Part ``flax``: a Flax NNX model of 8.4M parameters built off the mesh, ``create_state``
(Adam) and one donated step on 8 devices; then every live array's bytes
(``jax.live_arrays()``) against the state's own (parameters + optimizer state): 1.00
when the values are held once, ~1.33 with Adam when the model keeps a second copy.

Part ``saves``: ``fit`` on 8 devices with a checkpoint every 10 steps (asynchronous, to a
local folder; ``--s3``: to the local S3 server too) against ``fit`` without checkpoints:
steps/s in rotating rounds, and the median of the per-round ratios (goal >= 0.95), for a
model of 2.1M parameters (25 MB of state with Adam; ~0.17 s a step here) and, as a
stress, one of 0.5M (~30 ms a step), where the save's part on the loop's thread (the
copy off the devices) weighs most. The process's first save, which sets Orbax up
(~1 s, once), is made before the rounds.

Prints one JSON line per measurement; ``--smoke`` for CI (small sizes, one round).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import json
import shutil
import statistics
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import meshfeed

OPTIMIZER = optax.adam(1e-4)
MB = 2**20


def init_params(blocks: int, width: int, hidden: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    params = {}
    for b in range(blocks):
        params[f"up{b}"] = (rng.normal(size=(width, hidden)) * 0.02).astype(np.float32)
        params[f"up_bias{b}"] = np.zeros(hidden, np.float32)
        params[f"down{b}"] = (rng.normal(size=(hidden, width)) * 0.02).astype(np.float32)
    return params


def loss_fn(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    x = batch["x"]
    blocks = sum(1 for name in params if name.startswith("down"))
    for b in range(blocks):
        x = x + jax.nn.gelu(x @ params[f"up{b}"] + params[f"up_bias{b}"]) @ params[f"down{b}"]
    return meshfeed.masked_mean(((x - batch["y"]) ** 2).mean(-1), batch), {}


def _abstract(tree: Any, sharding: Any = None) -> Any:
    def one(x: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or x.sharding)

    return jax.tree.map(one, tree)


def _device_bytes(tree: Any) -> int:
    """The bytes of ``tree`` one device holds."""
    return sum(
        int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
        for x in jax.tree.leaves(tree)
    )


def _peak(stats: Any) -> int:
    """A compiled step's peak on one device: its arguments and outputs, less what the
    donation reuses, and its temporaries."""
    return (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
    )


def memory(blocks: int, width: int, hidden: int, batch: int, smoke: bool) -> None:
    mesh = meshfeed.make_mesh(data=8)
    params = init_params(blocks, width, hidden)
    count = sum(v.size for v in params.values())
    fsdp = meshfeed.TrainState.create(params, OPTIMIZER, mesh=mesh, param_sharding="fsdp")
    del params
    rows = NamedSharding(mesh, P("data"))
    batch_abstract = {
        "x": jax.ShapeDtypeStruct((batch, width), jnp.float32, sharding=rows),
        "y": jax.ShapeDtypeStruct((batch, width), jnp.float32, sharding=rows),
    }
    ways = {
        "replicated": (_abstract(fsdp, NamedSharding(mesh, P())), False),
        "replicated_donated": (_abstract(fsdp, NamedSharding(mesh, P())), True),
        "fsdp_donated": (_abstract(fsdp), True),
    }
    for name, (state, donate) in ways.items():
        step = meshfeed.make_train_step(loss_fn, OPTIMIZER, mesh=mesh, donate=donate)
        stats = step.lower(state, batch_abstract).compile().memory_analysis()
        peak = _peak(stats)
        print(json.dumps({
            "benchmark": "train_memory", "part": "memory", "way": name,
            "parameters": int(count), "devices": 8,
            "state_mb_per_device": round(_device_bytes(state) / MB, 1),
            "arguments_mb": round(stats.argument_size_in_bytes / MB, 1),
            "outputs_mb": round(stats.output_size_in_bytes / MB, 1),
            "reused_mb": round(stats.alias_size_in_bytes / MB, 1),
            "temporaries_mb": round(stats.temp_size_in_bytes / MB, 1),
            "peak_mb": round(peak / MB, 1), "smoke": smoke,
        }), flush=True)  # fmt: skip


def token_loss(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token regression through residual MLP blocks; the mean over counted tokens."""
    x = params["embed"][batch["tokens"]]
    blocks = sum(1 for name in params if name.startswith("down"))
    for b in range(blocks):
        x = x + jax.nn.gelu(x @ params[f"up{b}"] + params[f"up_bias{b}"]) @ params[f"down{b}"]
    counted = batch["loss_mask"]
    per_token = jnp.where(counted, ((x - params["embed"][batch["targets"]]) ** 2).mean(-1), 0)
    count = jnp.sum(counted)
    return jnp.sum(per_token) / jnp.maximum(count, 1), {"count": count}


def microbatches(width: int, hidden: int, rows: int, tokens: int, smoke: bool) -> None:
    mesh = meshfeed.make_mesh(data=8)
    params = {"embed": np.zeros((1024, width), np.float32), **init_params(2, width, hidden)}
    count = sum(v.size for v in params.values())
    state = _abstract(
        meshfeed.TrainState.create(params, OPTIMIZER, mesh=mesh), NamedSharding(mesh, P())
    )
    sharding = NamedSharding(mesh, P("data"))
    batch = {
        name: jax.ShapeDtypeStruct((rows, tokens), dtype, sharding=sharding)
        for name, dtype in [("tokens", jnp.int32), ("targets", jnp.int32),
                            ("loss_mask", jnp.bool_)]
    }  # fmt: skip
    first = None
    for m in (1, 2, 4):
        step = meshfeed.make_train_step(token_loss, OPTIMIZER, mesh=mesh, microbatches=m)
        stats = step.lower(state, batch).compile().memory_analysis()
        peak = _peak(stats)
        first = first or (peak, stats.temp_size_in_bytes)
        print(json.dumps({
            "benchmark": "train_memory", "part": "microbatches", "microbatches": m,
            "parameters": int(count), "devices": 8, "rows_per_device": rows // 8,
            "tokens": tokens, "state_mb_per_device": round(_device_bytes(state) / MB, 1),
            "temporaries_mb": round(stats.temp_size_in_bytes / MB, 1),
            "peak_mb": round(peak / MB, 1),
            "peak_over_unsplit": round(peak / first[0], 3),
            "temporaries_over_unsplit": round(stats.temp_size_in_bytes / first[1], 3),
            "smoke": smoke,
        }), flush=True)  # fmt: skip


def flax_bytes(width: int, layers: int, smoke: bool) -> None:
    import gc

    from flax import nnx

    import meshfeed.flax

    class Stack(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(layers)])

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers:
                x = x + jnp.tanh(layer(x))
            return x

    def loss(model: Any, batch: Any) -> Any:
        return jnp.mean((model(batch["x"]) - batch["x"]) ** 2), {}

    gc.collect()
    before = {id(a) for a in jax.live_arrays()}
    mesh = meshfeed.make_mesh(data=8)
    with nnx.use_eager_sharding(False):
        model = Stack(nnx.Rngs(0))
    optimizer = optax.adam(1e-3)
    state = meshfeed.flax.create_state(model, optimizer, mesh=mesh)
    step = meshfeed.flax.make_train_step(model, loss, optimizer, mesh=mesh)
    x = jax.device_put(np.ones((64, width), np.float32), meshfeed.batch_sharding(mesh))
    state, metrics = step(state, {"x": x})
    jax.block_until_ready((state, metrics))
    del metrics
    gc.collect()
    held = sum(
        a.nbytes for a in jax.live_arrays()
        if id(a) not in before and a is not x and not a.is_deleted()
    )  # fmt: skip
    own = sum(a.nbytes for a in jax.tree.leaves((state.params, state.opt_state)))
    params = sum(a.nbytes for a in jax.tree.leaves(state.params))
    print(json.dumps({
        "benchmark": "train_memory", "part": "flax", "parameters": params // 4,
        "params_mb": round(params / MB, 1), "state_mb": round(own / MB, 1),
        "held_mb": round(held / MB, 1), "held_over_state": round(held / own, 3),
        "smoke": smoke,
    }), flush=True)  # fmt: skip


def _run(steps: int, params: dict[str, np.ndarray], width: int, where: str | None,
         options: Any) -> float:  # fmt: skip
    """Steps/s of ``fit`` over ``steps`` steps, saving every 10 to ``where`` (or not)."""
    mesh = meshfeed.make_mesh(data=8)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4096, width)).astype(np.float32)
    source = meshfeed.ArraySource({"x": x, "y": np.roll(x, 1, axis=1)})
    loader = meshfeed.Loader(source, global_batch_size=64, num_epochs=None,
                             sharding=meshfeed.batch_sharding(mesh))  # fmt: skip
    state = meshfeed.TrainState.create(params, OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, OPTIMIZER, mesh=mesh)
    state, _ = step(state, next(iter(loader)))  # compiled before the timing
    loader.reset()
    jax.block_until_ready(state)
    start = time.perf_counter()
    meshfeed.fit(step, state, loader, num_steps=steps, progress=False, log_every=steps,
                 checkpoint_dir=where, checkpoint_every=10 if where else None,
                 storage_options=options)  # fmt: skip
    seconds = time.perf_counter() - start
    loader.close()
    return steps / seconds


def saves(width: int, hidden: int, steps: int, rounds: int, s3: bool, smoke: bool) -> None:
    """One line: steps/s without saves, with saves every 10 (and their ratios)."""
    params = init_params(1, width, hidden)
    count = sum(v.size for v in params.values())
    server = None
    entries = ["none", "local"]
    if s3:
        from meshfeed.testing import S3Server

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
        server = S3Server()
        server.make_bucket("runs")
        entries.append("s3")
    got: dict[str, list[float]] = {e: [] for e in entries}
    warm = tempfile.mkdtemp(prefix="meshfeed-saves-")  # the process's first save sets up
    _run(10, params, width, warm, None)  # Orbax (~1 s, once): not the rounds' to pay
    shutil.rmtree(warm, ignore_errors=True)
    try:
        for r in range(rounds):
            for e in entries[r % len(entries) :] + entries[: r % len(entries)]:
                scratch = tempfile.mkdtemp(prefix="meshfeed-saves-")
                where = {"none": None, "local": scratch, "s3": f"s3://runs/r{r}"}[e]
                options = server.storage_options if server is not None and e == "s3" else None
                got[e].append(_run(steps, params, width, where, options))
                shutil.rmtree(scratch, ignore_errors=True)
    finally:
        if server is not None:
            server.close()
    line: dict[str, Any] = {"benchmark": "train_memory", "part": "saves", "parameters": int(count),
                            "state_mb": round(3 * 4 * count / MB, 1), "steps": steps,
                            "save_every": 10, "rounds": rounds, "smoke": smoke}  # fmt: skip
    for e in entries:
        line[f"{e}_steps_per_s"] = round(statistics.median(got[e]), 2)
        if e != "none":
            ratios = [a / b for a, b in zip(got[e], got["none"], strict=True)]
            line[f"{e}_over_none"] = round(statistics.median(ratios), 3)
    print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, one round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--s3", action="store_true", help="save to the local S3 server too")
    parser.add_argument("--parts", default="memory,microbatches,flax,saves",
                        help="which parts to run, comma-separated")  # fmt: skip
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if args.smoke:
        memory(1, 256, 1024, 64, smoke=True)
        microbatches(64, 256, 32, 64, smoke=True)
        flax_bytes(128, 2, smoke=True)
        saves(128, 512, 20, 1, args.s3, smoke=True)
        return
    if "memory" in parts:
        memory(3, 2048, 8192, 64, smoke=False)
    if "microbatches" in parts:
        microbatches(256, 2048, 128, 512, smoke=False)
    if "flax" in parts:
        flax_bytes(1024, 8, smoke=False)
    if "saves" in parts:
        saves(512, 2048, 120, args.rounds, args.s3, smoke=False)
        saves(256, 1024, 120, args.rounds, args.s3, smoke=False)


if __name__ == "__main__":
    main()
