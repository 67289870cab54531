"""``meshfeed demo --lm``: a byte-level language model on Python's own standard library.

The documents are the blank-line-separated blocks of the standard library's ``.py``
files (they ship with every Python: nothing is downloaded), as bytes: a vocabulary of
256. ``meshfeed.pack`` packs them into rows of ``SEQ_LEN`` bytes with segment ids and
positions; a small decoder-only transformer in plain JAX attends only inside each
document (``meshfeed.segment_mask``) and trains hybrid parallel on a ``data x model``
mesh: the batch split over ``data``, each MLP's hidden units over ``model``. The loss
is reported in bits per byte. After training, the run restores its mid-way checkpoint
into a fresh loader and checks that the stream continues exactly where it was.
"""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np

SEQ_LEN = 256
GLOBAL_BATCH_SIZE = 16
STEPS = 300
LEARNING_RATE = 3e-3
WIDTH = 64
HEADS = 4
LAYERS = 2
HIDDEN = 256
MAX_BYTES = 1_500_000  # of the standard library, in file-name order


def stdlib_documents(max_bytes: int = MAX_BYTES) -> list[np.ndarray]:
    """Blank-line-separated blocks of the standard library's ``.py`` files, as bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs: list[np.ndarray] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        for block in path.read_bytes().split(b"\n\n"):
            if block.strip():
                docs.append(np.frombuffer(block + b"\n\n", np.uint8).astype(np.int32))
                total += len(block) + 2
        if total >= max_bytes:
            break
    return docs


def init_params(seed: int = 0) -> dict[str, Any]:
    """The transformer's weights, the same on every process."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float) -> np.ndarray:
        return (rng.normal(size=shape) * scale).astype(np.float32)

    layers = [
        {
            "qkv": normal(WIDTH, 3 * WIDTH, scale=WIDTH**-0.5),
            "out": normal(WIDTH, WIDTH, scale=(2 * LAYERS * WIDTH) ** -0.5),
            "up": normal(WIDTH, HIDDEN, scale=WIDTH**-0.5),
            "down": normal(HIDDEN, WIDTH, scale=(2 * LAYERS * HIDDEN) ** -0.5),
        }
        for _ in range(LAYERS)
    ]
    return {
        "embed": normal(256, WIDTH, scale=1.0),
        "position": normal(SEQ_LEN, WIDTH, scale=0.1),
        "layers": layers,
        "head": normal(WIDTH, 256, scale=WIDTH**-0.5),
    }


def place_params(params: dict[str, Any], mesh: Any) -> dict[str, Any]:
    """Each MLP's hidden units over ``model`` (hybrid parallel); the rest replicated."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def place(x: np.ndarray, spec: Any) -> Any:
        return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])

    placed = {k: place(v, P()) for k, v in params.items() if k != "layers"}
    placed["layers"] = [
        {
            "qkv": place(layer["qkv"], P()),
            "out": place(layer["out"], P()),
            "up": place(layer["up"], P(None, "model")),
            "down": place(layer["down"], P("model", None)),
        }
        for layer in params["layers"]
    ]
    return placed


def _norm(x: Any) -> Any:
    import jax.numpy as jnp

    return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)


def logits(params: Any, batch: Any) -> Any:
    """``[batch, SEQ_LEN, 256]`` next-byte logits of the packed rows."""
    import jax
    import jax.numpy as jnp

    import meshfeed

    x = params["embed"][batch["tokens"]] + params["position"][batch["positions"]]
    mask = meshfeed.segment_mask(batch["segment_ids"])[:, None]  # [batch, heads, L, L]
    b, length, _ = x.shape
    for layer in params["layers"]:
        q, k, v = jnp.split(_norm(x) @ layer["qkv"], 3, axis=-1)
        q, k, v = (t.reshape(b, length, HEADS, -1).transpose(0, 2, 1, 3) for t in (q, k, v))
        scores = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]), -1e9)
        attended = (jax.nn.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(b, length, -1)
        x = x + attended @ layer["out"]
        x = x + jax.nn.gelu(_norm(x) @ layer["up"]) @ layer["down"]
    return _norm(x) @ params["head"]


def loss_fn(params: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
    """Bits per byte of each byte predicting the next one of its own document."""
    import jax
    import jax.numpy as jnp

    segments = batch["segment_ids"]
    targets = jnp.roll(batch["tokens"], -1, axis=-1)
    counted = (jnp.roll(segments, -1, axis=-1) == segments) & (segments > 0)
    counted = counted.at[:, -1].set(False)
    if "mask" in batch:  # padded rows of a last batch count for nothing
        counted = counted & batch["mask"][:, None]
    log_p = jax.nn.log_softmax(logits(params, batch))
    nats = -jnp.take_along_axis(log_p, targets[..., None], -1)[..., 0]
    bits = jnp.sum(jnp.where(counted, nats, 0.0)) / jnp.maximum(jnp.sum(counted), 1) / math.log(2)
    return bits, {}


def train_lm(*, steps: int = STEPS, progress: bool = True, checkpoint_dir: str) -> dict[str, Any]:
    """Packs, trains, and resumes from the mid-way checkpoint; returns the figures."""
    import jax
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from rich.console import Console

    import meshfeed

    mesh = meshfeed.make_mesh(data=jax.device_count() // 2, model=2)
    docs = meshfeed.ArraySource({"tokens": meshfeed.Ragged.from_list(stdlib_documents())})
    packed = meshfeed.pack(docs, SEQ_LEN)
    stats = packed.stats()
    sharding = NamedSharding(mesh, P("data", None))

    def loader() -> meshfeed.Loader:
        return meshfeed.Loader(
            packed, global_batch_size=GLOBAL_BATCH_SIZE, sharding=sharding, num_epochs=None
        )

    show = progress and jax.process_index() == 0
    console = Console()
    if show:
        console.print(
            f"[bold]meshfeed demo --lm[/]: a byte-level transformer ({LAYERS} layers, width "
            f"{WIDTH}) on Python's standard library, {jax.process_count()} processes x "
            f"{jax.local_device_count()} CPU devices, mesh {dict(mesh.shape)}: batch over "
            "'data', MLP hidden units over 'model'"
        )
        console.print(
            f"packed {stats['documents']:,} documents ({stats['tokens']:,} bytes) into "
            f"{stats['rows']:,} rows of {SEQ_LEN}: {100 * stats['padding_fraction']:.2f}% "
            f"padding, {stats['split_documents']} documents split; loss in bits per byte"
        )
    optimizer = optax.adam(LEARNING_RATE)
    state = meshfeed.TrainState.create(place_params(init_params(), mesh), optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, optimizer, mesh=mesh)
    history = meshfeed.fit(
        step,
        state,
        loader(),
        num_steps=steps,
        log_every=max(1, steps // 10),
        progress=progress,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=steps // 2,
    )
    # A new job picks up the mid-way checkpoint: the next batch is the one the
    # uninterrupted stream drew at that step, bit for bit.
    middle = steps // 2
    resumed = loader()
    target = meshfeed.TrainState.create(place_params(init_params(1), mesh), optimizer, mesh=mesh)
    restored = meshfeed.restore_checkpoint(checkpoint_dir, target, resumed, step=middle)
    same = all(
        np.array_equal(np.asarray(a.addressable_data(0)), np.asarray(b.addressable_data(0)))
        for a, b in zip(
            jax.tree.leaves(resumed.batch(resumed.step)),
            jax.tree.leaves(loader().batch(middle)),
            strict=True,
        )
    )
    final = history.train[-1]["loss"]
    if show:
        console.print(
            f"final loss [bold]{final:.2f} bits per byte[/] after {history.steps} steps "
            f"({history.seconds:.0f} s, {history.samples_per_s * SEQ_LEN:,.0f} bytes/s)"
        )
        console.print(
            f"resumed from the checkpoint at step {middle} in a new loader: at step "
            f"{resumed.step}, the next batch is the uninterrupted stream's: {same}"
        )
    return {
        "bits_per_byte": final,
        "resumed_same": same,
        "restored_step": int(restored.step),
        "padding_fraction": stats["padding_fraction"],
    }
