"""What the remote-read benchmarks share: moto's S3 server, a loader, children, fit's figures."""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax
from harness import median_of, run_child, use_cpu_devices

import meshfeed
from common import fit_digits

FIT_DIGITS = {
    "input_wait_share": 4,
    "loader_share": 4,
    "samples_per_s": None,
    "prefetch_depth": None,
}


@contextmanager
def s3_store() -> Iterator[tuple[Any, Any, dict[str, Any]]]:
    """moto's S3 server with a bucket ``data``, a ``CountingProxy`` in front of it and the
    storage options that go through the proxy; both closed after."""
    from meshfeed.testing import CountingProxy, S3Server  # not in every build --src names

    server = S3Server()
    proxy = CountingProxy(server.port)
    try:
        server.make_bucket("data")
        yield server, proxy, {**server.storage_options, "endpoint_url": proxy.endpoint}
    finally:
        proxy.close()
        server.close()


def loader(source: Any, batch: int, **options: Any) -> meshfeed.Loader:
    """An endless ``Loader`` (unless ``num_epochs`` is given) over every device."""
    sharding = meshfeed.batch_sharding(meshfeed.make_mesh(data=jax.device_count()))
    options = {"num_epochs": None, **options}
    return meshfeed.Loader(source, global_batch_size=batch, sharding=sharding, **options)


CALL = "import json, sys, {0}; print(json.dumps({0}.{1}(*json.loads(sys.argv[1]))))"


def in_child(fn: Callable[..., Any], *args: Any, src: str | None = None) -> Any:
    """``fn(*args)`` in a fresh process of 8 CPU devices that imports ``fn``'s module
    (``src``, another build's meshfeed, first on its path): what it returned, via JSON."""
    use_cpu_devices()  # this process's environment, the child's
    call = CALL.format(Path(inspect.getfile(fn)).stem, fn.__name__)
    path = [src, str(Path(__file__).parent), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
    return run_child(["-c", call, json.dumps(args)], env=env)


def figures(per_round: Sequence[Any], name: str, digits: dict[str, Any]) -> dict[str, Any]:
    """``{key: the median over rounds of name's figure[key], rounded to digits[key]}``."""
    return {k: round(median_of(per_round, name, k) or 0.0, d) for k, d in digits.items()}


def fit_figures(fed: meshfeed.Loader, steps: int) -> dict[str, float]:
    """The demo's convnet trained by ``fit_digits`` on ``fed``: the figures of ``FIT_DIGITS``."""
    history = fit_digits(fed, steps)
    got = {k: getattr(history, k) for k in ("input_wait_share", "loader_share", "samples_per_s")}
    return {**got, "prefetch_depth": fed.prefetch_depth}
