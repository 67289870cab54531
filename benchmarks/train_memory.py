"""Training at real size: a device's memory for the state, donated and sharded; saves that
run on while training goes on.

Parts: ``memory`` (an MLP of ~100M parameters with Adam on 8 CPU devices: the compiled
step's ``memory_analysis()`` a device, replicated, donated and FSDP, lowered for
abstract states so nothing is allocated), ``microbatches`` (a model whose activations
dominate, with ``microbatches`` 1, 2 and 4), ``flax`` (every live array's bytes after a
Flax NNX ``create_state`` and one step, against the state's own: 1.00 when held once)
and ``saves`` (``fit`` with an asynchronous checkpoint every 10 steps against none,
rotating rounds, the median of the per-round ratios; goal >= 0.95; ``--s3``: to the
local S3 server too). ``--smoke`` for CI (small sizes, one round).
"""

from __future__ import annotations

import argparse
import functools
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
    blocks = sum(1 for name in params if name.startswith("down"))
    for b in range(blocks):
        x = x + jax.nn.gelu(x @ params[f"up{b}"] + params[f"up_bias{b}"]) @ params[f"down{b}"]
    return x


def loss_fn(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    x = mlp(params, batch["x"])
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


def _memory_line(part: str, stats: Any, state: Any, count: int, smoke: bool, **fields: Any) -> None:
    """A compiled step's line: its state's and its ``memory_analysis()``'s MB a device."""
    emit(
        "train_memory",
        smoke=smoke,
        part=part,
        **fields,
        parameters=int(count),
        devices=8,
        state_mb_per_device=round(_device_bytes(state) / MB, 1),
        **memory_figures(stats, digits=1),
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
        _memory_line("memory", stats, state, count, smoke, way=name)


def token_loss(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token regression through residual MLP blocks; the mean over counted tokens."""
    x = mlp(params, params["embed"][batch["tokens"]])
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
    dtypes = {"tokens": jnp.int32, "targets": jnp.int32, "loss_mask": jnp.bool_}
    batch = {
        name: jax.ShapeDtypeStruct((rows, tokens), dtype, sharding=sharding)
        for name, dtype in dtypes.items()
    }
    first = None
    for m in (1, 2, 4):
        step = meshfeed.make_train_step(token_loss, OPTIMIZER, mesh=mesh, microbatches=m)
        stats = step.lower(state, batch).compile().memory_analysis()
        peak = peak_bytes(stats)
        first = first or (peak, stats.temp_size_in_bytes)
        _memory_line(
            "microbatches",
            stats,
            state,
            count,
            smoke,
            microbatches=m,
            rows_per_device=rows // 8,
            tokens=tokens,
            peak_over_unsplit=round(peak / first[0], 3),
            temporaries_over_unsplit=round(stats.temp_size_in_bytes / first[1], 3),
        )


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
    new = [a for a in jax.live_arrays() if id(a) not in before and a is not x]
    held = sum(a.nbytes for a in new if not a.is_deleted())
    own = sum(a.nbytes for a in jax.tree.leaves((state.params, state.opt_state)))
    params = sum(a.nbytes for a in jax.tree.leaves(state.params))
    emit(
        "train_memory",
        smoke=smoke,
        part="flax",
        parameters=params // 4,
        params_mb=round(params / MB, 1),
        state_mb=round(own / MB, 1),
        held_mb=round(held / MB, 1),
        held_over_state=round(held / own, 3),
    )


def _run(
    steps: int, params: dict[str, np.ndarray], width: int, where: str | None, options: Any
) -> float:
    """Steps/s of ``fit`` over ``steps`` steps, saving every 10 to ``where`` (or not)."""
    mesh = meshfeed.make_mesh(data=8)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4096, width)).astype(np.float32)
    source = meshfeed.ArraySource({"x": x, "y": np.roll(x, 1, axis=1)})
    sharding = meshfeed.batch_sharding(mesh)
    loader = meshfeed.Loader(source, global_batch_size=64, num_epochs=None, sharding=sharding)
    state = meshfeed.TrainState.create(params, OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, OPTIMIZER, mesh=mesh)
    state, _ = step(state, next(iter(loader)))  # compiled before the timing
    loader.reset()
    jax.block_until_ready(state)
    start = time.perf_counter()
    meshfeed.fit(
        step,
        state,
        loader,
        num_steps=steps,
        progress=False,
        log_every=steps,
        checkpoint_dir=where,
        checkpoint_every=10 if where else None,
        storage_options=options,
    )
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
    warm = tempfile.mkdtemp(prefix="meshfeed-saves-")  # the process's first save sets up
    _run(10, params, width, warm, None)  # Orbax (~1 s, once): not the rounds' to pay
    shutil.rmtree(warm, ignore_errors=True)
    runs = {e: functools.partial(_save, e, steps, params, width, server) for e in entries}
    try:
        per_round = in_rounds(runs, rounds)
    finally:
        if server is not None:
            server.close()
    line: dict[str, Any] = {
        "part": "saves",
        "parameters": int(count),
        "state_mb": round(3 * 4 * count / MB, 1),
        "steps": steps,
        "save_every": 10,
        "rounds": rounds,
    }
    for e in entries:
        line[f"{e}_steps_per_s"] = round(median_of(per_round, e) or 0.0, 2)
        if e != "none":
            line[f"{e}_over_none"] = median_ratio(per_round, e, "none")
    emit("train_memory", smoke=smoke, **line)


def _save(entry: str, steps: int, params: Any, width: int, server: Any) -> float:
    """``_run`` saving to nowhere, a fresh local folder or the S3 server's bucket."""
    scratch = tempfile.mkdtemp(prefix="meshfeed-saves-")
    where = {"none": None, "local": scratch, "s3": f"s3://runs/{os.path.basename(scratch)}"}
    options = server.storage_options if entry == "s3" else None
    try:
        return _run(steps, params, width, where[entry], options)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--s3", action="store_true", help="save to the local S3 server too")
    parser.add_argument(
        "--parts",
        default="memory,microbatches,flax,saves",
        help="which parts to run, comma-separated",
    )


def main() -> None:
    use_cpu_devices()
    args = arguments(__doc__, rounds=3, add=_flags)
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
