"""The demo: a small convnet trained data-parallel on scikit-learn's handwritten digits.

``run_demo`` starts 2 local processes x 4 CPU devices (the same launcher as
``meshfeed.testing.run_in_processes``); each process loads only the rows of each global
batch that its devices hold, and process 0 shows the mesh, the batch layout, a progress
bar and the test accuracy. The digits ship inside scikit-learn: nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

GLOBAL_BATCH_SIZE = 64
EPOCHS = 12
TEST_FRACTION = 0.2
LEARNING_RATE = 3e-3


def digits() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Train and test splits of the 1797 8x8 digits, images in [0, 1], NHWC."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the demo trains on scikit-learn's digits; pip install 'meshfeed[demo]'"
            " (from a clone: pip install -e '.[demo]')."
        ) from e
    data: Any = load_digits()
    images = (np.asarray(data.images) / 16.0).astype(np.float32)[..., None]
    labels = np.asarray(data.target).astype(np.int32)
    order = np.random.default_rng(0).permutation(len(labels))
    cut = int(len(labels) * (1 - TEST_FRACTION))
    train, test = order[:cut], order[cut:]
    return (
        {"image": images[train], "label": labels[train]},
        {"image": images[test], "label": labels[test]},
    )


def init_params(seed: int = 0) -> dict[str, np.ndarray]:
    """Conv 3x3x16, conv 3x3x32 stride 2, dense 10; the same values on every process."""
    rng = np.random.default_rng(seed)

    def he(*shape: int) -> np.ndarray:
        fan_in = int(np.prod(shape[:-1]))
        return (rng.normal(size=shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return {
        "conv1": he(3, 3, 1, 16),
        "bias1": np.zeros(16, np.float32),
        "conv2": he(3, 3, 16, 32),
        "bias2": np.zeros(32, np.float32),
        "dense": he(4 * 4 * 32, 10),
        "bias3": np.zeros(10, np.float32),
    }


def logits(params: Any, images: Any) -> Any:
    import jax

    dims = ("NHWC", "HWIO", "NHWC")
    x = jax.lax.conv_general_dilated(
        images, params["conv1"], (1, 1), "SAME", dimension_numbers=dims
    )
    x = jax.nn.relu(x + params["bias1"])
    x = jax.lax.conv_general_dilated(x, params["conv2"], (2, 2), "SAME", dimension_numbers=dims)
    x = jax.nn.relu(x + params["bias2"])
    return x.reshape(x.shape[0], -1) @ params["dense"] + params["bias3"]


def loss_fn(params: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
    import jax.numpy as jnp
    import optax

    import meshfeed

    out = logits(params, batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(out, batch["label"])
    correct = (jnp.argmax(out, -1) == batch["label"]).astype(jnp.float32)
    return meshfeed.masked_mean(loss, batch), {"accuracy": meshfeed.masked_mean(correct, batch)}


def eval_fn(params: Any, batch: Any) -> dict[str, Any]:
    return loss_fn(params, batch)[1]


def digit_loaders(mesh: Any, *, epochs: int, strategy: str = "per_process") -> tuple[Any, Any]:
    """The shuffled training loader and the padded, in-order test loader on ``mesh``."""
    import meshfeed

    train, test = digits()
    sharding = meshfeed.batch_sharding(mesh)
    loader = meshfeed.Loader(
        meshfeed.ArraySource(train),
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=sharding,
        num_epochs=epochs,
        seed=0,
        strategy=strategy,  # type: ignore[arg-type]
    )
    test_loader = meshfeed.Loader(
        meshfeed.ArraySource(test),
        global_batch_size=GLOBAL_BATCH_SIZE,
        sharding=sharding,
        shuffle=False,
        last_batch="pad",
    )
    return loader, test_loader


def train_digits(*, epochs: int = EPOCHS, mode: str = "jit", progress: bool = True) -> dict:
    """Trains on this process's share of every batch; returns the final test metrics."""
    import jax
    import optax
    from rich.console import Console

    import meshfeed

    mesh = meshfeed.make_mesh(data=jax.device_count())
    sharding = meshfeed.batch_sharding(mesh)
    loader, test_loader = digit_loaders(mesh, epochs=epochs, strategy="auto")
    show = progress and jax.process_index() == 0
    if show:
        console = Console()
        console.print(
            f"[bold]meshfeed demo[/]: {len(loader.source)} train / {len(test_loader.source)} test "
            f"digits, {jax.process_count()} processes x {jax.local_device_count()} CPU "
            f"devices, mesh {dict(mesh.shape)}, mode={mode!r}"
        )
        console.print(
            f"batch: {GLOBAL_BATCH_SIZE} rows split over 'data'; strategy "
            f"{loader.strategy!r}: {loader.plan.reason}"
        )
        console.print(f"layout of the label field {GLOBAL_BATCH_SIZE} rows, device ids:")
        jax.debug.visualize_sharding((GLOBAL_BATCH_SIZE,), sharding)
    optimizer = optax.adam(LEARNING_RATE)
    state = meshfeed.TrainState.create(init_params(), optimizer, mesh=mesh)
    step = meshfeed.make_train_step(loss_fn, optimizer, mesh=mesh, mode=mode)  # type: ignore[arg-type]
    history = meshfeed.fit(
        step,
        state,
        loader,
        eval_loader=test_loader,
        eval_fn=eval_fn,
        eval_every=loader.steps_per_epoch * 4,
        log_every=loader.steps_per_epoch,
        progress=progress,
    )
    result = {**history.eval[-1], "seconds": history.seconds, "steps": history.steps}
    if show:
        Console().print(
            f"test accuracy [bold]{100 * result['accuracy']:.1f}%[/] after {history.steps} steps "
            f"({history.seconds:.1f} s, {history.samples_per_s:,.0f} samples/s, input wait "
            f"{100 * history.input_wait_share:.1f}%)"
        )
    return result


def keras_convnet() -> Any:
    """The Keras multi-device guide's convnet (conv + batch norm + dropout), for 8x8 digits.

    Batch norm uses momentum 0.9 rather than Keras' 0.99: a few hundred steps are not
    enough for 0.99 moving statistics to forget their initial values.
    """
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    x = inputs
    for filters, strides, padding in ((12, 1, "same"), (24, 2, "valid"), (32, 2, "same")):
        x = keras.layers.Conv2D(filters, 3, strides=strides, padding=padding, use_bias=False)(x)
        x = keras.layers.BatchNormalization(scale=False, momentum=0.9)(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(256, activation="relu")(x)
    x = keras.layers.Dropout(0.5)(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def train_digits_keras(*, epochs: int = 8, progress: bool = True) -> dict:
    """The Keras flavour of ``train_digits``: ``meshfeed.keras.fit`` on this process's share."""
    import jax
    import keras
    from rich.console import Console

    import meshfeed
    import meshfeed.keras

    mesh = meshfeed.make_mesh(data=jax.device_count())
    loader, test_loader = digit_loaders(mesh, epochs=epochs)
    show = progress and jax.process_index() == 0
    if show:
        Console().print(
            f"[bold]meshfeed demo --keras[/]: the Keras guide's convnet on "
            f"{len(loader.source)} train / {len(test_loader.source)} test digits, "
            f"{jax.process_count()} processes x {jax.local_device_count()} CPU devices, "
            f"mesh {dict(mesh.shape)}"
        )
    model = keras_convnet()
    history = meshfeed.keras.fit(
        model,
        loader,
        optimizer=keras.optimizers.Adam(LEARNING_RATE),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        mesh=mesh,
        x="image",
        y="label",
        epochs=epochs,
        eval_loader=test_loader,
        progress=progress,
    )
    result = {"accuracy": history.history["val_accuracy"][-1], "epochs": len(history.epoch)}
    if show:
        Console().print(
            f"test accuracy [bold]{100 * result['accuracy']:.1f}%[/] after {result['epochs']} "
            "epochs (model.predict agrees: the trained weights were written back)"
        )
    return result


def demo_process(
    *,
    keras: bool = False,
    lm: str | None = None,
    steps: int | None = None,
    epochs: int | None = None,
) -> None:
    """Entry point of each demo process (``lm``: the checkpoint folder of the LM demo,
    ``steps`` its steps; ``epochs``: the Keras demo's)."""
    import meshfeed

    meshfeed.initialize()
    if lm is not None:
        from meshfeed._cli.lm import STEPS, train_lm

        train_lm(checkpoint_dir=lm, steps=steps or STEPS)
    elif keras:
        train_digits_keras() if epochs is None else train_digits_keras(epochs=epochs)
    else:
        train_digits()


def run_demo(
    *,
    num_processes: int = 2,
    devices_per_process: int = 4,
    keras: bool = False,
    lm: bool = False,
    steps: int | None = None,
    epochs: int | None = None,
) -> int:
    """Starts the demo processes and waits; returns the exit code.

    Shows process 0's output (less gloo's connection chatter); a failing process's
    output is shown in full.
    """
    import importlib.util
    import shutil
    import sys
    import tempfile

    from meshfeed._cli.flags import fail
    from meshfeed._cli.lm import GLOBAL_BATCH_SIZE as LM_BATCH
    from meshfeed.cluster._launch import GlooFilter, python_argv, start_processes, supervise

    if keras and importlib.util.find_spec("keras") is None:
        fail(
            "demo --keras needs Keras: pip install -e '.[keras]' in a clone of meshfeed "
            "(or pip install 'meshfeed[keras]')."
        )
    if num_processes < 1 or devices_per_process < 1:
        fail("--processes and --devices-per-process must be >= 1.")
    if steps is not None and (not lm or steps < 2):
        fail("--steps is the LM demo's (--lm): pass a number of steps >= 2.")
    if epochs is not None and (not keras or epochs < 1):
        fail("--epochs is the Keras demo's (--keras): pass a number of epochs >= 1.")
    devices = num_processes * devices_per_process
    batch, over = (LM_BATCH, devices // 2) if lm else (GLOBAL_BATCH_SIZE, devices)
    if (lm and devices % 2) or over < 1 or batch % over:
        what = "data=devices/2 (model=2)" if lm else "all devices"
        fail(
            f"the demo splits its batch of {batch} rows over {what}, and "
            f"{num_processes} processes x {devices_per_process} devices do not divide it; "
            "try --processes 2 --devices-per-process 4 (the default) or --processes 1."
        )

    gloo = GlooFilter()

    def show(process_id: int, line: str) -> None:
        if process_id == 0 and not gloo.chatter(line):
            sys.stdout.write(line)
            sys.stdout.flush()

    env = {"COLUMNS": str(shutil.get_terminal_size().columns)}  # rich sees a pipe
    if keras:
        env["KERAS_BACKEND"] = "jax"
    with tempfile.TemporaryDirectory(prefix="meshfeed-lm-") as checkpoints:
        where = repr(checkpoints) if lm else None
        code = (
            "from meshfeed._cli.demo import demo_process; "
            f"demo_process(keras={keras}, lm={where}, steps={steps}, epochs={epochs})"
        )
        children = start_processes(
            python_argv(code),
            num_processes=num_processes,
            devices_per_process=devices_per_process,
            on_line=show,
            extra_env=env,
        )
        failed, _ = supervise(children)
    if failed is None:
        return 0
    sys.stderr.write(f"process {failed.process_id} failed:\n{failed.output_tail()}")
    return failed.popen.returncode or 1
