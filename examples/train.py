"""Train a small network on scikit-learn's digits, data-parallel, alone or launched.

The same script runs three ways; ``meshfeed.initialize()`` at its top connects the
processes when there are several and does nothing when there is one:

- alone, one process on every local device: ``python examples/train.py --epochs 3``
- two local processes of 4 CPU devices each: ``python -m meshfeed launch -n 2
  --devices-per-process 4 -- python examples/train.py --epochs 3``
- on a cluster (Slurm, Kubernetes, ...): one copy per host, started by the cluster.

Each process reads only the rows its devices hold. Process 0 prints the mesh, a line per
logged step, and the accuracy on the held-out digits after each epoch.
"""

import argparse

import meshfeed

meshfeed.initialize()
import jax  # noqa: E402 -- after initialize, like any multi-process JAX program
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch", type=int, default=64, help="global batch size")
args = parser.parse_args()

digits = load_digits()
x = (np.asarray(digits.data) / 16.0).astype(np.float32)  # 1797 images of 8x8, flattened
y = np.asarray(digits.target).astype(np.int32)
train = meshfeed.ArraySource({"x": x[:1500], "label": y[:1500]})
test = meshfeed.ArraySource({"x": x[1500:], "label": y[1500:]})

mesh = meshfeed.make_mesh(data=jax.device_count())
sharding = meshfeed.batch_sharding(mesh)
loader = meshfeed.Loader(
    train, global_batch_size=args.batch, sharding=sharding, num_epochs=args.epochs
)
test_loader = meshfeed.Loader(
    test, global_batch_size=args.batch, sharding=sharding, shuffle=False, last_batch="pad"
)

rng = np.random.default_rng(0)
params = {
    "w1": (rng.normal(size=(64, 128)) * np.sqrt(2 / 64)).astype(np.float32),
    "b1": np.zeros(128, np.float32),
    "w2": (rng.normal(size=(128, 10)) * np.sqrt(2 / 128)).astype(np.float32),
    "b2": np.zeros(10, np.float32),
}


def logits(p, batch):
    hidden = jax.nn.relu(batch["x"] @ p["w1"] + p["b1"])
    return hidden @ p["w2"] + p["b2"]


def loss_fn(p, batch):
    loss = optax.softmax_cross_entropy_with_integer_labels(logits(p, batch), batch["label"])
    return meshfeed.masked_mean(loss, batch), {}


def eval_fn(p, batch):
    correct = jnp.argmax(logits(p, batch), -1) == batch["label"]
    return {"accuracy": meshfeed.masked_mean(correct.astype(jnp.float32), batch)}


optimizer = optax.adam(3e-3)
state = meshfeed.TrainState.create(params, optimizer, mesh=mesh)
step = meshfeed.make_train_step(loss_fn, optimizer, mesh=mesh)
if jax.process_index() == 0:
    print(f"{jax.process_count()} process(es), mesh {dict(mesh.shape)}, batch {args.batch}")
history = meshfeed.fit(step, state, loader, eval_loader=test_loader, eval_fn=eval_fn)
if jax.process_index() == 0:
    print(f"test accuracy after {args.epochs} epochs: {history.eval[-1]['accuracy']:.3f}")
