"""Packed rows with a loss mask, a next-token model counted by tokens, and its training.

Importable by the processes ``run_in_processes`` starts.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import meshfeed

VOCAB, WIDTH, SEQ_LEN, BATCH = 64, 16, 32, 32
OPTIMIZER = optax.adam(1e-2)


def packed() -> meshfeed.sources.Packed:
    """Documents of 1 to 40 tokens packed into rows of 32, each token a loss-mask bit."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, 400)
    docs = [rng.integers(0, VOCAB, n).astype(np.int32) for n in lengths]
    counted = [rng.random(n) < 0.7 for n in lengths]
    source = meshfeed.ArraySource(
        {
            "tokens": meshfeed.Ragged.from_list(docs, dtype=np.int32),
            "loss_mask": meshfeed.Ragged.from_list(counted, dtype=bool),
        }
    )
    return meshfeed.pack(source, SEQ_LEN)


def init_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "embed": (rng.normal(size=(VOCAB, WIDTH)) * 0.5).astype(np.float32),
        "mix": (rng.normal(size=(WIDTH, WIDTH)) * 0.3).astype(np.float32),
        "head": (rng.normal(size=(WIDTH, VOCAB)) * 0.3).astype(np.float32),
    }


def token_nats(params: Any, batch: Any) -> tuple[jax.Array, jax.Array]:
    """Each token's next-token loss and whether it counts (same document, loss mask)."""
    tokens, segments = batch["tokens"], batch["segment_ids"]
    x = params["embed"][tokens]
    x = x + jnp.tanh(x @ params["mix"])
    log_p = jax.nn.log_softmax(x @ params["head"])
    targets = jnp.roll(tokens, -1, axis=-1)
    same = (jnp.roll(segments, -1, axis=-1) == segments) & (segments > 0)
    counted = same.at[:, -1].set(False) & batch["loss_mask"]
    nats = -jnp.take_along_axis(log_p, targets[..., None], -1)[..., 0]
    return jnp.where(counted, nats, 0.0), counted


def counted_loss(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The mean over the counted tokens, and their count."""
    nats, counted = token_nats(params, batch)
    count = jnp.sum(counted)
    return jnp.sum(nats) / jnp.maximum(count, 1), {"count": count}


def uncounted_loss(params: Any, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The same mean, with no count: each part weighted by rows."""
    return counted_loss(params, batch)[0], {}


def train(
    mode: str, microbatches: int, steps: int = 3, loss_fn: Any = counted_loss
) -> dict[str, Any]:
    """``steps`` steps on a data-parallel mesh of every device; params and metrics."""
    mesh = meshfeed.make_mesh(data=jax.device_count())
    state = meshfeed.TrainState.create(init_params(), OPTIMIZER, mesh=mesh)
    step = meshfeed.make_train_step(
        loss_fn,
        OPTIMIZER,
        mesh=mesh,
        mode=mode,  # type: ignore[arg-type]
        microbatches=microbatches,
    )
    loader = meshfeed.Loader(
        packed(), global_batch_size=BATCH, sharding=meshfeed.batch_sharding(mesh), seed=3
    )
    metrics: list[dict[str, float]] = []
    for _, batch in zip(range(steps), loader, strict=False):
        state, out = step(state, batch)
        metrics.append({k: float(np.asarray(v.addressable_data(0))) for k, v in out.items()})
    gathered = jax.tree.map(lambda v: np.asarray(v.addressable_data(0)), state.params)
    return {"params": gathered, "metrics": metrics}
