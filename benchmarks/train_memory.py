"""Training at real size: a device's memory for the state (replicated, donated, FSDP, with
``microbatches``, after a Flax NNX step), and ``fit``'s steps/s saving every 10 steps against
none (``--s3``: to the local S3 server too). Goal: saves >= 0.95x."""

from __future__ import annotations

import argparse
import functools
import gc
import math
import os
import shutil
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from harness import arguments, emit, in_rounds, median_of, median_ratio, use_cpu_devices
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from memory_fns import MB, memory_figures, peak_bytes

import meshfeed

OPTIMIZER = optax.adam(1e-4)
SIZES = {  # each part's sizes: the calls of a full run, then of --smoke
    "memory": ([(3, 2048, 8192, 64)], [(1, 256, 1024, 64)]),
    "microbatches": ([(256, 2048, 128, 512)], [(64, 256, 32, 64)]),
    "flax": ([(1024, 8)], [(128, 2)]),
    "saves": ([(512, 2048, 120), (256, 1024, 120)], [(128, 512, 20)]),
}


def init_params(blocks: int, width: int, hidden: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    params = {}
    for b in range(blocks):
        params[f"up{b}"] = (rng.normal(size=(width, hidden)) * 0.02).astype(np.float32)
        params[f"up_bias{b}"] = np.zeros(hidden, np.float32)
        params[f"down{b}"] = (rng.normal(size=(hidden, width)) * 0.02).astype(np.float32)
    return params


def mlp(params: Any, x: jax.Array) -> jax.Array:
    """``x`` through ``init_params``'s residual MLP blocks."""
    for b in range(sum(name.startswith("down") for name in params)):
        x = x + jax.nn.gelu(x @ params[f"up{b}"] + params[f"up_bias{b}"]) @ params[f"down{b}"]
    return x


def loss_fn(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    x = mlp(params, batch["x"])
    return meshfeed.masked_mean(((x - batch["y"]) ** 2).mean(-1), batch), {}


def token_loss(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token regression through residual MLP blocks; the mean over counted tokens."""
    x = mlp(params, params["embed"][batch["tokens"]])
    counted = batch["loss_mask"]
    per_token = jnp.where(counted, ((x - params["embed"][batch["targets"]]) ** 2).mean(-1), 0)
    count = jnp.sum(counted)
    return jnp.sum(per_token) / jnp.maximum(count, 1), {"count": count}


def _abstract(tree: Any, sharding: Any = None) -> Any:
    def one(x: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or x.sharding)

    return jax.tree.map(one, tree)


def _memory_lines(part: str, loss: Any, ways: list, batch: dict, smoke: bool) -> None:
    """A line a way ``(fields, state, step options)``: MB a device, lowered for abstracts."""
    mesh = meshfeed.make_mesh(data=8)
    count = sum(x.size for x in jax.tree.leaves(ways[0][1].params))
    first = None
    for fields, state, options in ways:
        step = meshfeed.make_train_step(loss, OPTIMIZER, mesh=mesh, **options)
        stats = step.lower(state, batch).compile().memory_analysis()
        first = first or (peak_bytes(stats), stats.temp_size_in_bytes)
        if part == "microbatches":
            fields["peak_over_unsplit"] = round(peak_bytes(stats) / first[0], 3)
            fields["temporaries_over_unsplit"] = round(stats.temp_size_in_bytes / first[1], 3)
        leaves = jax.tree.leaves(state)
        held = sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in leaves)
        line = {"part": part, **fields, "parameters": int(count), "devices": 8}
        line["state_mb_per_device"] = round(held / MB, 1)
        emit("train_memory", smoke=smoke, **line, **memory_figures(stats, digits=1))


def memory(args: argparse.Namespace, blocks: int, width: int, hidden: int, batch: int) -> None:
    mesh = meshfeed.make_mesh(data=8)
    params = init_params(blocks, width, hidden)
    fsdp = meshfeed.TrainState.create(params, OPTIMIZER, mesh=mesh, param_sharding="fsdp")
    del params
    replicated = _abstract(fsdp, NamedSharding(mesh, P()))
    ways = [
        ({"way": "replicated"}, replicated, {"donate": False}),
        ({"way": "replicated_donated"}, replicated, {"donate": True}),
        ({"way": "fsdp_donated"}, _abstract(fsdp), {"donate": True}),
    ]
    row = jax.ShapeDtypeStruct((batch, width), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    _memory_lines("memory", loss_fn, ways, {"x": row, "y": row}, args.smoke)


def microbatches(args: argparse.Namespace, width: int, hidden: int, rows: int, tokens: int) -> None:
    mesh = meshfeed.make_mesh(data=8)
    params = {"embed": np.zeros((1024, width), np.float32), **init_params(2, width, hidden)}
    state = meshfeed.TrainState.create(params, OPTIMIZER, mesh=mesh)
    state = _abstract(state, NamedSharding(mesh, P()))
    sharding = NamedSharding(mesh, P("data"))
    dtypes = {"tokens": jnp.int32, "targets": jnp.int32, "loss_mask": jnp.bool_}
    batch = {
        k: jax.ShapeDtypeStruct((rows, tokens), t, sharding=sharding) for k, t in dtypes.items()
    }
    shape = {"rows_per_device": rows // 8, "tokens": tokens}
    ways = [({"microbatches": m, **shape}, state, {"microbatches": m}) for m in (1, 2, 4)]
    _memory_lines("microbatches", token_loss, ways, batch, args.smoke)


def flax_bytes(args: argparse.Namespace, width: int, layers: int) -> None:
    """Every live array's bytes after a Flax NNX ``create_state`` and a step, over the state's."""
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
    new = [a for a in jax.live_arrays() if id(a) not in before and a is not x]
    held = sum(a.nbytes for a in new if not a.is_deleted())
    own = sum(a.nbytes for a in jax.tree.leaves((state.params, state.opt_state)))
    params = sum(a.nbytes for a in jax.tree.leaves(state.params))
    line = {"part": "flax", "parameters": params // 4, "params_mb": round(params / MB, 1)}
    line |= {"state_mb": round(own / MB, 1), "held_mb": round(held / MB, 1)}
    emit("train_memory", smoke=args.smoke, **line, held_over_state=round(held / own, 3))


def _fit(steps: int, params: Any, width: int, entry: str, server: Any = None) -> float:
    """Steps/s of ``fit`` saving every 10 steps to ``entry``: none, a local folder or S3."""
    mesh = meshfeed.make_mesh(data=8)
    x = np.random.default_rng(1).normal(size=(4096, width)).astype(np.float32)
    source = meshfeed.ArraySource({"x": x, "y": np.roll(x, 1, axis=1)})
    sharding = meshfeed.batch_sharding(mesh)
    loader = meshfeed.Loader(source, global_batch_size=64, num_epochs=None, sharding=sharding)
    state = meshfeed.TrainState.create(params, OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, OPTIMIZER, mesh=mesh)
    state, _ = step(state, next(iter(loader)))  # compiled before the timing
    loader.reset()
    jax.block_until_ready(state)
    scratch = tempfile.mkdtemp(prefix="meshfeed-saves-")
    where = {"none": None, "local": scratch, "s3": f"s3://runs/{os.path.basename(scratch)}"}
    saving = {"checkpoint_dir": where[entry], "checkpoint_every": 10 if entry != "none" else None}
    saving["log_every"] = steps
    saving["storage_options"] = server.storage_options if entry == "s3" else None
    start = time.perf_counter()
    try:
        meshfeed.fit(step, state, loader, num_steps=steps, progress=False, **saving)
        return steps / (time.perf_counter() - start)
    finally:
        loader.close()
        shutil.rmtree(scratch, ignore_errors=True)


def saves(args: argparse.Namespace, width: int, hidden: int, steps: int) -> None:
    params = init_params(1, width, hidden)
    count = sum(v.size for v in params.values())
    server = None
    entries = ["none", "local"]
    if args.s3:
        from meshfeed.testing import S3Server

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
        server = S3Server()
        server.make_bucket("runs")
        entries.append("s3")
    _fit(10, params, width, "local")  # the process's first save sets up Orbax (~1 s, once)
    runs = {e: functools.partial(_fit, steps, params, width, e, server) for e in entries}
    try:
        per_round = in_rounds(runs, args.rounds)
    finally:
        if server is not None:
            server.close()
    line = {"part": "saves", "parameters": int(count), "state_mb": round(3 * 4 * count / MB, 1)}
    line |= {"steps": steps, "save_every": 10, "rounds": args.rounds}
    for e in entries:
        line[f"{e}_steps_per_s"] = round(median_of(per_round, e) or 0.0, 2)
        if e != "none":
            line[f"{e}_over_none"] = median_ratio(per_round, e, "none")
    emit("train_memory", smoke=args.smoke, **line)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s3", action="store_true", help="save to the local S3 server too")
    parts = "memory,microbatches,flax,saves"
    parser.add_argument("--parts", default=parts, help="which parts to run, comma-separated")


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=3, add=_flags)
    parts = {"memory": memory, "microbatches": microbatches, "flax": flax_bytes, "saves": saves}
    for part, run in parts.items():
        if args.smoke or part in args.parts.split(","):  # --smoke: every part, small
            full, smoke = SIZES[part]
            for sizes in smoke if args.smoke else full:
                run(args, *sizes)


if __name__ == "__main__":
    main()
