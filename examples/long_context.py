"""A small transformer on long packed rows split over a data x context mesh.

Documents of long-tail lengths (the longest split) are packed into rows of
``--seq-len`` tokens with ``meshfeed.pack``, laid out for the context axis with
``meshfeed.sources.context_layout`` (dual chunk) and loaded with ``P('data',
'context')``, each device reading only its share of each row. Attention stays inside
each document under ``jax.shard_map`` (``meshfeed.train.packed_attention(...,
context_axis='context')``), the parameters replicated; the loss is every real token's,
summed and divided by their count over the whole mesh. The run first checks that the
loss of a packed, laid-out row is the sum of its documents' run alone, then trains.
With ``--checkpoint DIR`` it saves the parameters and the loader's state half-way and
keeps the batches and losses after that; ``--resume DIR`` continues from that save on
however many processes it runs on, and compares. Two processes of 4 devices save, then
one process of 8 resumes: ``meshfeed launch -n 2 --devices-per-process 4 -- python
examples/long_context.py --checkpoint /tmp/lc``, then ``python examples/long_context.py
--resume /tmp/lc`` (``--seq-len 8192`` for longer rows). Alone, without either, it
trains on every local device. Process 0 prints, in the first run then in the second::

    [0] 2 process(es) x 4 devices, mesh {'data': 2, 'context': 4}, dual chunk layout
    [0] 300 documents (28 longer than a row, split) in 139 rows of 512 tokens
    [0] packed row loss = sum over its documents alone, for each of the 8 rows of step 0: True
    [0] loss 6.7 -> 2.4 bits per token over 20 steps
    [0] saved the parameters and the loader's state at step 10
    1 process(es) x 8 devices, mesh {'data': 2, 'context': 4}, dual chunk layout
    300 documents (28 longer than a row, split) in 139 rows of 512 tokens
    resumed at step 10 of a 2-process run: the next 10 batches are the uninterrupted run's: True
    and so are their losses, to float tolerance: True
"""

import argparse
import math
import os
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # 8 CPU devices

import meshfeed

meshfeed.initialize()
import jax  # noqa: E402 -- after initialize, like any multi-process JAX program
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from meshfeed.train import packed_attention  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seq-len", type=int, default=512, help="tokens per row, T")
parser.add_argument("--cp", type=int, default=4, help="devices on the context axis")
parser.add_argument("--batch", type=int, default=8, help="global batch size, in rows")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--docs", type=int, default=300, help="documents made")
parser.add_argument("--checkpoint", type=Path, help="save at --steps // 2 here")
parser.add_argument("--resume", type=Path, help="continue from the save here")
args = parser.parse_args()
VOCAB, WIDTH, HEADS, LAYERS = 64, 64, 4, 2
FIELDS = ("tokens", "targets", "segment_ids", "positions")
ROWS = P(meshfeed.DATA, meshfeed.CONTEXT)  # rows over data, each row's tokens over context
AXES = (meshfeed.DATA, meshfeed.CONTEXT)


def make_documents(n, seq_len, seed=0):
    """``n`` documents of long-tail lengths, each a walk through a fixed table that gives
    every token 4 equally likely successors (a floor of 2 bits a token), stored as its
    tokens and each token's target, the next one."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum((rng.pareto(1.3, n) + 1) * seq_len / 8, 4 * seq_len).astype(int)
    successors = rng.integers(0, VOCAB, (VOCAB, 4))
    walk = np.empty(lengths.sum() + n, np.int32)
    walk[0] = 0
    choice = rng.integers(0, 4, len(walk))
    for i in range(1, len(walk)):
        walk[i] = successors[walk[i - 1], choice[i]]
    docs = np.split(walk, np.cumsum(lengths + 1)[:-1])
    return meshfeed.ArraySource(
        {
            "tokens": meshfeed.Ragged.from_list([d[:-1] for d in docs], dtype=np.int32),
            "targets": meshfeed.Ragged.from_list([d[1:] for d in docs], dtype=np.int32),
        }
    )  # packed alongside the tokens, a target moves with its token in any layout


documents = make_documents(args.docs, args.seq_len)
packed = meshfeed.pack(documents, args.seq_len)  # tokens, targets, segment_ids, positions
laid_out = meshfeed.sources.context_layout(packed, cp=args.cp)  # dual chunk
mesh = meshfeed.make_mesh(data=jax.device_count() // args.cp, context=args.cp)
loader = meshfeed.Loader(laid_out, global_batch_size=args.batch, num_epochs=None,
                         sharding=NamedSharding(mesh, ROWS), strategy="per_device")  # fmt: skip
main = jax.process_index() == 0
if main:
    stats = packed.stats()
    print(f"{jax.process_count()} process(es) x {jax.local_device_count()} devices, "
          f"mesh {dict(mesh.shape)}, dual chunk layout")  # fmt: skip
    print(f"{stats['documents']} documents ({stats['split_documents']} longer than a row, "
          f"split) in {stats['rows']} rows of {args.seq_len} tokens")  # fmt: skip

rng = np.random.default_rng(0)  # the same initial weights on every process


def weights(*shape, scale):
    return (rng.normal(size=shape) * scale).astype(np.float32)


params = {
    "embed": weights(VOCAB, WIDTH, scale=1.0),
    "position": weights(args.seq_len, WIDTH, scale=0.1),
    "head": weights(WIDTH, VOCAB, scale=WIDTH**-0.5),
    "layers": [
        {
            "qkv": weights(WIDTH, 3 * WIDTH, scale=WIDTH**-0.5),
            "out": weights(WIDTH, WIDTH, scale=(2 * LAYERS * WIDTH) ** -0.5),
            "up": weights(WIDTH, 4 * WIDTH, scale=WIDTH**-0.5),
            "down": weights(4 * WIDTH, WIDTH, scale=(8 * LAYERS * WIDTH) ** -0.5),
        }
        for _ in range(LAYERS)
    ],
}


def norm(x):
    return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)


def token_nats(params, batch, context_axis=None):
    """Each token's loss in nats, 0 on padding, ``[rows, tokens]``: of whole rows, or
    with ``context_axis`` (inside ``shard_map``) of this device's slice of them."""
    ids, positions = batch["segment_ids"], batch["positions"]
    x = params["embed"][batch["tokens"]] + params["position"][positions]
    rows, tokens, _ = x.shape
    for layer in params["layers"]:
        q, k, v = (
            y.reshape(rows, tokens, HEADS, -1) for y in jnp.split(norm(x) @ layer["qkv"], 3, -1)
        )
        out = packed_attention(q, k, v, ids, positions=positions, context_axis=context_axis)
        x = x + out.reshape(rows, tokens, WIDTH) @ layer["out"]
        x = x + jax.nn.gelu(norm(x) @ layer["up"]) @ layer["down"]
    log_p = jax.nn.log_softmax(norm(x) @ params["head"])
    nats = -jnp.take_along_axis(log_p, batch["targets"][..., None], -1)[..., 0]
    return jnp.where(ids > 0, nats, 0.0)


def local_loss(params, batch):
    """Bits per real token over the whole mesh, from this device's slice."""
    nats = token_nats(params, batch, context_axis=meshfeed.CONTEXT)
    count = jax.lax.psum(jnp.sum(batch["segment_ids"] > 0), AXES)
    return jax.lax.psum(jnp.sum(nats), AXES) / jnp.maximum(count, 1) / math.log(2)


def loss_fn(params, batch):
    fields = {name: batch[name] for name in FIELDS}
    mapped = jax.shard_map(local_loss, mesh=mesh, in_specs=(P(), ROWS), out_specs=P())
    return mapped(params, fields), {}


def per_row(params, batch):
    """Each row's summed loss in nats, ``[rows]``, on every process."""
    nats = jax.shard_map(
        lambda p, b: token_nats(p, b, context_axis=meshfeed.CONTEXT),
        mesh=mesh, in_specs=(P(), ROWS), out_specs=ROWS,
    )(params, {name: batch[name] for name in FIELDS})  # fmt: skip
    return jnp.sum(nats, axis=1)


def alone(params, step):
    """Each row of ``step`` as the sum of its documents' losses, each document (piece)
    run alone: its own row, in its own order, positions 0..L-1, no layout."""
    pieces = [packed.pieces(int(row)) for row in loader.ids(step)]
    flat = [piece for row in pieces for piece in row]
    rows = {name: np.zeros((len(flat), args.seq_len), np.int32) for name in FIELDS}
    for i, (doc, start, length) in enumerate(flat):
        document = documents[doc]
        for name in ("tokens", "targets"):
            rows[name][i, :length] = document[name][start : start + length]
        rows["segment_ids"][i, :length] = 1
        rows["positions"][i, :length] = np.arange(length)
    nats = np.asarray(jax.jit(token_nats)(params, rows)).sum(axis=1)
    owner = np.repeat(np.arange(len(pieces)), [len(p) for p in pieces])
    return np.bincount(owner, weights=nats, minlength=len(pieces))


def value(x):
    return float(x.addressable_data(0))  # replicated: every process holds it


optimizer = optax.adam(3e-3)
state = meshfeed.TrainState.create(params, optimizer, mesh=mesh)
step_fn = meshfeed.make_train_step(loss_fn, optimizer, mesh=mesh)
replicated = NamedSharding(mesh, P())
if not args.resume:  # every process takes part; process 0 runs the documents alone
    packed_rows = jax.jit(per_row, out_shardings=replicated)(state.params, loader.batch(0))
    if main:
        same = np.allclose(packed_rows.addressable_data(0), alone(params, 0), rtol=1e-5)
        print(f"packed row loss = sum over its documents alone, for each of the "
              f"{args.batch} rows of step 0: {same}")  # fmt: skip

half = args.steps // 2
first = half if args.resume else 0
if args.resume:  # the state saved at step `half`, on this mesh; the loader continues there
    kept = np.load(args.resume / "after.npz")
    if int(kept["steps"]) != args.steps:
        parser.error(f"{args.resume} was saved by a run of --steps {int(kept['steps'])}; pass that")
    state = meshfeed.restore_checkpoint(args.resume / "ckpt", state, loader, step=half)
losses, batches = [], []
stream = iter(loader)
for step in range(first, args.steps):
    if args.checkpoint and step == half:
        meshfeed.save_checkpoint(args.checkpoint / "ckpt", step, state, loader)
    batch = next(stream)
    if step >= half and (args.checkpoint or args.resume):  # the global batch, everywhere
        batches.append(multihost_utils.process_allgather({f: batch[f] for f in FIELDS}, tiled=True))
    state, metrics = step_fn(state, batch)
    losses.append(value(metrics["loss"]))
loader.close()

if main and not args.resume:
    print(f"loss {losses[0]:.1f} -> {losses[-1]:.1f} bits per token over {args.steps} steps")
if args.checkpoint and main:
    after = {f"{f}_{i}": b[f] for i, b in enumerate(batches) for f in FIELDS}
    np.savez(args.checkpoint / "after.npz", losses=np.array(losses[half:]),
             processes=jax.process_count(), steps=args.steps, **after)  # fmt: skip
    print(f"saved the parameters and the loader's state at step {half}")
if args.resume and main:
    equal = all(
        np.array_equal(b[f], kept[f"{f}_{i}"]) for i, b in enumerate(batches) for f in FIELDS
    )
    print(f"resumed at step {half} of a {int(kept['processes'])}-process run: the next "
          f"{len(batches)} batches are the uninterrupted run's: {equal}")  # fmt: skip
    close = np.allclose(losses, kept["losses"], rtol=1e-5)
    print(f"and so are their losses, to float tolerance: {close}")
