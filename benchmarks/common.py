"""What two benchmarks measure alike: timing, the peers' loaders, global arrays, the digits
(the harness itself, flags, rounds and JSON lines, is ``harness.py``). Benchmarks use
meshfeed's public API only."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
import optax

import meshfeed

DIGITS_BATCH_SIZE = 64
DIGITS_LEARNING_RATE = 3e-3

Run = Callable[[], Iterator[Any]]  # an entry: starts an endless iterator of global jax.Arrays


def not_installed(package: str) -> str:
    """The line a skipped peer's entry gives in place of figures."""
    return f"{package} is not installed (pip install 'meshfeed[bench]')"


def measure(
    run: Run,
    batch: int,
    seconds: float,
    warmup: int = 3,
    *,
    steps: int | None = None,
) -> float:
    """Samples per second over ``seconds`` of steady-state iteration of ``run()``; with
    ``steps``, over exactly that many steps instead: several processes whose steps run a
    collective must all stop after the same count, or one would wait for the others."""
    it = run()
    for _ in range(warmup):
        jax.block_until_ready(next(it))
    done = 0
    start = time.perf_counter()
    while True:
        jax.block_until_ready(next(it))
        done += 1
        elapsed = time.perf_counter() - start
        if (done >= steps) if steps is not None else (elapsed >= seconds):
            return done * batch / elapsed


def loops_at_once(script: str, count: int) -> float:
    """The sum of what ``count`` processes running ``script`` at once print: each prints
    ``ready`` when set up, waits for a line on stdin (so all start together), runs, and
    prints its rate."""
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    for run in runs:
        assert run.stdout is not None and run.stdout.readline().strip() == "ready"
    for run in runs:
        assert run.stdin is not None
        run.stdin.write("go\n")
        run.stdin.flush()
    return sum(float(run.communicate()[0]) for run in runs)


def to_global(batches: Iterator[dict[str, np.ndarray]], global_batch_size: int) -> Iterator[Any]:
    """A peer loader's host batches (this process's rows) as global ``jax.Array``s,
    split over every device with ``make_array_from_process_local_data`` -- how every
    benchmark entry ends, so that peers and meshfeed deliver the same thing."""
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))
    for batch in batches:
        yield {
            k: jax.make_array_from_process_local_data(
                sharding, v, (global_batch_size, *v.shape[1:])
            )
            for k, v in batch.items()
        }


def loader_batches(make_source: Callable[[], meshfeed.Source], batch: int, **options: Any) -> Run:
    """``Loader(make_source(), global_batch_size=batch, **options)`` on every device,
    endless, as a ``Run`` (the loader closed when its iterator is dropped)."""
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))

    def run() -> Iterator[Any]:
        loader = meshfeed.Loader(
            make_source(),
            global_batch_size=batch,
            sharding=sharding,
            num_epochs=None,
            **options,
        )
        try:
            yield from loader
        finally:
            loader.close()

    return run


def collate(records: Any) -> dict[str, np.ndarray]:
    """A list of records as one batch, field by field (the peers' numpy collate)."""
    return {k: np.stack([r[k] for r in records]) for k in records[0]}


class Records:
    """Per-record random access over arrays, the shape Grain and PyTorch datasets take;
    on several processes, each process's peer reads its own share of the examples."""

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        share = slice(jax.process_index(), None, jax.process_count())
        self.arrays = {k: a[share] for k, a in arrays.items()}
        self.n = len(next(iter(self.arrays.values())))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {k: a[i] for k, a in self.arrays.items()}


def torch_batches(
    dataset: Any,
    batch: int,
    *,
    workers: int = 0,
    collate_fn: Callable[[Any], Any] = collate,
    **options: Any,
) -> Run | str:
    """The PyTorch ``DataLoader`` over a map-style ``dataset`` (shuffled, seeded, this
    process's share of ``batch``), then global arrays, endless; or why it is skipped."""
    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        return not_installed("torch")

    def run() -> Iterator[Any]:
        loader = DataLoader(
            dataset,
            batch_size=batch // jax.process_count(),
            shuffle=True,
            drop_last=True,
            collate_fn=collate_fn,
            num_workers=workers,
            persistent_workers=workers > 0,
            generator=torch.Generator().manual_seed(0),
            **options,
        )
        while True:
            yield from to_global(iter(loader), batch)

    return run


def grain_batches(
    records: Callable[[], Any],
    batch: int,
    *,
    decode: Callable[[Any], Any] | None = None,
    batch_fn: Callable[[Any], Any] | None = None,
) -> Run | str:
    """Grain's ``MapDataset`` over ``records()`` (shuffled anew each epoch, then ``decode``
    each, batched by this process's share of ``batch``), then global arrays, endless; or
    why it is skipped."""
    try:
        import grain
    except ImportError:
        return not_installed("grain")

    def run() -> Iterator[Any]:
        for epoch in itertools.count():
            ds = grain.MapDataset.source(records()).shuffle(seed=epoch)
            ds = ds if decode is None else ds.map(decode)
            ds = ds.batch(batch // jax.process_count(), drop_remainder=True, batch_fn=batch_fn)
            yield from to_global(iter(ds), batch)

    return run


def digits() -> dict[str, np.ndarray]:
    """scikit-learn's 1797 8x8 handwritten digits, images in [0, 1], NHWC."""
    from sklearn.datasets import load_digits

    data: Any = load_digits()
    images = (np.asarray(data.images) / 16.0).astype(np.float32)[..., None]
    return {"image": images, "label": np.asarray(data.target).astype(np.int32)}


def digits_params(seed: int = 0) -> dict[str, np.ndarray]:
    """A small convnet for the digits (the demo's shape): two 3x3 convs, then dense."""
    rng = np.random.default_rng(seed)
    shapes = {"conv1": (3, 3, 1, 16), "conv2": (3, 3, 16, 32), "dense": (4 * 4 * 32, 10)}
    params = {
        name: (rng.normal(size=s) * np.sqrt(2.0 / np.prod(s[:-1]))).astype(np.float32)
        for name, s in shapes.items()
    }
    return {**params, **{f"{n}_bias": np.zeros(s[-1], np.float32) for n, s in shapes.items()}}


def digits_loss(params: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
    """Cross-entropy of the convnet on ``batch`` (mean over its valid rows)."""
    dims = ("NHWC", "HWIO", "NHWC")
    x = batch["image"]
    for name, stride in (("conv1", 1), ("conv2", 2)):
        x = jax.lax.conv_general_dilated(
            x, params[name], (stride,) * 2, "SAME", dimension_numbers=dims
        )
        x = jax.nn.relu(x + params[f"{name}_bias"])
    logits = x.reshape(x.shape[0], -1) @ params["dense"] + params["dense_bias"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    return meshfeed.masked_mean(loss, batch), {}


def fit_digits(loader: meshfeed.Loader, steps: int) -> meshfeed.train.History:
    """The demo's convnet trained by ``fit`` for ``steps`` steps of ``loader`` (the digits
    at ``DIGITS_BATCH_SIZE``), compiled before the timed loop."""
    mesh = next(iter(loader.batch(0).values())).sharding.mesh  # type: ignore[attr-defined]
    optimizer = optax.adam(DIGITS_LEARNING_RATE)
    state = meshfeed.TrainState.create(digits_params(), optimizer, mesh=mesh)
    step = meshfeed.make_train_step(digits_loss, optimizer, mesh=mesh)
    state, _ = step(state, loader.batch(0))  # compile outside the timed loop
    jax.block_until_ready(state)
    return meshfeed.fit(step, state, loader, num_steps=steps, log_every=50, progress=False)


class Remote:
    """An in-memory source that takes ``latency_s`` per read, like a remote store."""

    def __init__(self, source: meshfeed.ArraySource, latency_s: float) -> None:
        self.source = source
        self.latency_s = latency_s

    @property
    def fields(self) -> Mapping[str, meshfeed.sources.FieldSpec]:
        return self.source.fields

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        time.sleep(self.latency_s)
        return self.source[ids]
