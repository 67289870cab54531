"""A small transformer trained on prepared tokens, packed, on a hybrid mesh: command three.

Opens the folder ``meshfeed prepare`` wrote -- checking that it was made with this
tokenizer (content hash and fingerprint) -- packs its documents into rows of
``--seq-len`` tokens (``meshfeed.pack``), and trains a two-layer transformer with
``meshfeed.fit``: the batch split over ``data``, each MLP's hidden units over ``model``
(hybrid data + model parallel), attention kept inside each document by
``meshfeed.segment_mask``. Process 0 prints the packing and the loss, first and last::

    python examples/lm_corpus.py /tmp/lm
    meshfeed prepare '/tmp/lm/corpus/*.jsonl' --tokenizer /tmp/lm/tokenizer.json \\
        --out /tmp/lm/tokens
    meshfeed launch -n 2 --devices-per-process 4 -- python examples/lm_train.py /tmp/lm

Alone (``python examples/lm_train.py /tmp/lm``) it runs on every local device.
"""

import argparse
import math
from pathlib import Path

import meshfeed

meshfeed.initialize()
import jax  # noqa: E402 -- after initialize, like any multi-process JAX program
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("folder", type=Path, help="holding tokens/ and tokenizer.json")
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--seq-len", type=int, default=256)
parser.add_argument("--batch", type=int, default=32, help="global batch size, in rows")
args = parser.parse_args()
WIDTH, HIDDEN, HEADS, LAYERS = 128, 512, 4, 2

tokenizer_path = args.folder / "tokenizer.json"
documents = meshfeed.open_source(args.folder / "tokens", tokenizer=tokenizer_path)
packed = meshfeed.pack(documents, args.seq_len)
vocab = Tokenizer.from_file(str(tokenizer_path)).get_vocab_size()
model = 2 if jax.device_count() % 2 == 0 else 1
mesh = meshfeed.make_mesh(data=jax.device_count() // model, model=model)
loader = meshfeed.Loader(packed, global_batch_size=args.batch, num_epochs=None,
                         sharding=NamedSharding(mesh, P("data", None)))  # fmt: skip
if jax.process_index() == 0:
    stats = packed.stats()
    padding = 100 * stats["padding_fraction"]
    print(f"{len(documents)} documents packed into {len(packed)} rows of {args.seq_len} "
          f"tokens, {padding:.1f}% padding; mesh {dict(mesh.shape)}")  # fmt: skip

rng = np.random.default_rng(0)  # the same initial weights on every process


def weights(*shape, scale):
    return (rng.normal(size=shape) * scale).astype(np.float32)


def place(x, spec):
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])


params = {
    "embed": place(weights(vocab, WIDTH, scale=1.0), P()),
    "position": place(weights(args.seq_len, WIDTH, scale=0.1), P()),
    "head": place(weights(WIDTH, vocab, scale=WIDTH**-0.5), P()),
    "layers": [
        {
            "qkv": place(weights(WIDTH, 3 * WIDTH, scale=WIDTH**-0.5), P()),
            "out": place(weights(WIDTH, WIDTH, scale=(2 * LAYERS * WIDTH) ** -0.5), P()),
            "up": place(weights(WIDTH, HIDDEN, scale=WIDTH**-0.5), P(None, "model")),
            "down": place(
                weights(HIDDEN, WIDTH, scale=(2 * LAYERS * HIDDEN) ** -0.5), P("model", None)
            ),
        }
        for _ in range(LAYERS)
    ],
}


def norm(x):
    return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)


def loss_fn(params, batch):
    """Mean next-token cross-entropy, in bits, inside each document of each row."""
    tokens, segments = batch["tokens"].astype(jnp.int32), batch["segment_ids"]
    x = params["embed"][tokens] + params["position"][batch["positions"]]
    mask = meshfeed.segment_mask(segments)[:, None]
    b, length, _ = x.shape
    for layer in params["layers"]:
        q, k, v = jnp.split(norm(x) @ layer["qkv"], 3, axis=-1)
        q, k, v = (t.reshape(b, length, HEADS, -1).transpose(0, 2, 1, 3) for t in (q, k, v))
        scores = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]), -1e9)
        x = (
            x
            + (jax.nn.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(b, length, -1)
            @ layer["out"]
        )
        x = x + jax.nn.gelu(norm(x) @ layer["up"]) @ layer["down"]
    log_p = jax.nn.log_softmax(norm(x) @ params["head"])
    targets = jnp.roll(tokens, -1, axis=-1)
    counted = (jnp.roll(segments, -1, axis=-1) == segments) & (segments > 0)
    counted = counted.at[:, -1].set(False)
    nats = -jnp.take_along_axis(log_p, targets[..., None], -1)[..., 0]
    bits = jnp.sum(jnp.where(counted, nats, 0.0)) / jnp.maximum(jnp.sum(counted), 1) / math.log(2)
    return bits, {}


optimizer = optax.adam(3e-3)
state = meshfeed.TrainState.create(params, optimizer, mesh=mesh)
step = meshfeed.make_train_step(loss_fn, optimizer, mesh=mesh)
history = meshfeed.fit(step, state, loader, num_steps=args.steps, log_every=max(1, args.steps // 4),
                       progress=False)  # fmt: skip
if jax.process_index() == 0:
    first, last = history.train[0]["loss"], history.train[-1]["loss"]
    at = int(history.train[0]["step"])
    print(f"loss {first:.2f} bits per token at step {at}, {last:.2f} after "
          f"{history.steps} steps ({history.samples_per_s:.0f} rows/s)")  # fmt: skip
