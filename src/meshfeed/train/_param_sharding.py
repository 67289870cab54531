"""How a train state's parameters and optimizer state are laid out over the mesh.

By default a parameter keeps the layout it was placed with (a kernel over ``'model'``,
say) and everything else is replicated: every device of a data-parallel mesh holds the
whole model and its optimizer state, which caps the model at what one device holds --
an 8B-parameter model with Adam is ~100 GB of state. ``param_sharding="fsdp"`` also
splits every large parameter over the data axis (fully sharded data parallel, ZeRO-3:
MaxText's ``fsdp`` axis, Levanter's ``FSDP``): each device keeps ``1/n`` of it, on the
largest dimension that ``n`` divides and that no other axis splits, so it composes with
a model axis (``P(None, 'model')`` becomes ``P('data', 'model')``). Leaves under
``FSDP_MIN_SIZE`` elements stay as they were: sharding a bias saves nothing and costs a
collective. Under ``jit`` XLA gathers each parameter where the step needs it and
reduce-scatters its gradient, so the step computes what the replicated one does. Any
other rule is a callable ``(path, leaf) -> PartitionSpec | None`` (``None``: the
default for that leaf).

The optimizer state follows the parameters: a leaf of it takes the layout of the
parameter whose path ends its own path and whose shape it has (Adam's ``mu`` and ``nu``
of a kernel, the kernel's), and the rest (Adam's count) is replicated; it is made in
that layout, never whole on a device first.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Literal, TypeAlias

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.core._mesh import DATA, spec_axes
from meshfeed.feed._shardings import place_host

FSDP_MIN_SIZE = 2**16
"""Elements a parameter needs before ``param_sharding="fsdp"`` splits it."""
ParamRule: TypeAlias = Callable[[str, Any], "P | None"]
"""``rule(path, leaf) -> PartitionSpec | None``: a parameter's layout (``path`` as
``jax.tree_util.keystr`` writes it, e.g. ``"['dense']['kernel']"``); ``None`` keeps the
default for it."""
ParamSharding: TypeAlias = Literal["fsdp"] | ParamRule | None
"""How ``TrainState.create`` lays out parameters: ``None`` (as placed, else replicated),
``"fsdp"`` (large ones split over the data axis too) or a ``ParamRule``."""


def check(rule: object, mesh: Mesh) -> None:
    """Refuses a ``param_sharding`` that is not one, or ``"fsdp"`` without a data axis."""
    if rule is None or callable(rule):
        return
    if rule != "fsdp":
        raise ValueError(
            f"param_sharding={rule!r} is unknown; pass 'fsdp' (parameters and optimizer "
            "state split over the data axis), a callable (path, leaf) -> PartitionSpec, "
            "or None (replicated)."
        )
    if DATA not in mesh.axis_names:
        raise ValueError(
            f"param_sharding='fsdp' splits parameters over the mesh axis {DATA!r}, which "
            f"the mesh {dict(mesh.shape)} does not have; name the data axis {DATA!r}, or "
            "pass a callable (path, leaf) -> PartitionSpec naming your own."
        )


def place(x: Any, mesh: Mesh) -> jax.Array:
    """``x`` on ``mesh``: its own layout if it has one there (or on a mesh of the same
    devices and axes), else replicated."""
    spec = own_spec(x, mesh)
    if spec is None:
        return place_host(np.asarray(x), NamedSharding(mesh, P()))
    if x.sharding.mesh == mesh:
        return x
    return jax.device_put(x, NamedSharding(mesh, spec))  # e.g. built under jax.set_mesh


def own_spec(x: Any, mesh: Mesh) -> P | None:
    """The spec of a ``jax.Array`` laid out on ``mesh`` (or on a mesh of the same
    devices and axes, other axis types), else ``None``."""
    sharding = getattr(x, "sharding", None)
    if not (isinstance(x, jax.Array) and isinstance(sharding, NamedSharding)):
        return None
    if sharding.mesh == mesh or (
        sharding.mesh.axis_names == mesh.axis_names
        and np.array_equal(sharding.mesh.devices, mesh.devices)  # type: ignore[arg-type]
    ):
        return sharding.spec
    return None


def fsdp_spec(shape: tuple[int, ...], spec: P, mesh: Mesh) -> P:
    """``spec`` with the data axis added on the largest dimension it divides (see the
    module docstring); ``spec`` itself for a small leaf or one no dimension fits."""
    n = mesh.shape[DATA]
    entries = [*tuple(spec), *[None] * (len(shape) - len(spec))]
    if n == 1 or math.prod(shape) < FSDP_MIN_SIZE:
        return spec
    if any(DATA in spec_axes(e) for e in entries):
        return spec
    free = [d for d, size in enumerate(shape) if entries[d] is None and size % n == 0]
    if not free:
        return spec
    entries[max(free, key=lambda d: (shape[d], -d))] = DATA
    return P(*entries)


def lay_out(params: Any, mesh: Mesh, rule: ParamSharding) -> Any:
    """``params`` placed on ``mesh`` by ``rule`` (see the module docstring)."""
    if rule is None:
        return jax.tree.map(lambda x: place(x, mesh), params)

    def one(path: Any, x: Any) -> jax.Array:
        placed = own_spec(x, mesh)
        spec = P() if placed is None else placed
        shape = tuple(np.shape(x))
        if rule == "fsdp":
            target = fsdp_spec(shape, spec, mesh)
        else:
            chosen = rule(jax.tree_util.keystr(path), x)  # type: ignore[operator]
            if chosen is not None and not isinstance(chosen, P):
                raise TypeError(
                    f"param_sharding's rule returned {chosen!r} for {jax.tree_util.keystr(path)};"
                    " return a jax.sharding.PartitionSpec, or None for the default."
                )
            target = spec if chosen is None else chosen
        sharding = NamedSharding(mesh, target)
        if placed is None:
            return place_host(np.asarray(x), sharding)
        return _resharder(sharding)(x) if target != placed else place(x, mesh)

    return jax.tree_util.tree_map_with_path(one, params)


def optimizer_state(optimizer: optax.GradientTransformation, params: Any, mesh: Mesh) -> Any:
    """``optimizer.init(params)``, each leaf made in the layout of the parameter it
    follows (see the module docstring), the others replicated."""
    by_path = {
        path: (x.shape, x.sharding) for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    shapes = jax.eval_shape(optimizer.init, params)
    replicated = NamedSharding(mesh, P())

    def follow(path: tuple[Any, ...], leaf: Any) -> NamedSharding:
        best: tuple[int, Any] = (-1, replicated)
        for own, (shape, sharding) in by_path.items():
            n = len(own)
            fits = n <= len(path) and tuple(path[len(path) - n :]) == tuple(own)
            if fits and n > best[0] and shape == leaf.shape:
                best = (n, sharding)
        return best[1]

    shardings = jax.tree_util.tree_map_with_path(follow, shapes)
    return jax.jit(optimizer.init, out_shardings=shardings)(params)


@functools.cache
def _resharder(sharding: NamedSharding) -> Callable[[jax.Array], jax.Array]:
    # A collective under jit: device_put between hosts is not supported on every backend.
    return jax.jit(lambda v: v, out_shardings=sharding)
