"""Sharded matrix multiplication, the classic strategies written with ``jax.shard_map``.

``matmul(a, b, mesh=mesh, strategy=...)`` computes ``a @ b`` for ``a: [M, K]`` and
``b: [K, N]``. Each strategy places the operands its way, runs one ``shard_map`` whose
collectives are spelled out, and returns the product in a documented layout. "The
devices" below are all of the mesh's devices, the mesh axes taken together in order
(``P(('data', 'model'))`` on a 2-D mesh).

========================  =======================  ===================  ==================
strategy                  a, b placed              communication        product
========================  =======================  ===================  ==================
``"replicated"``          whole on every device    none                 ``P()``, whole
``"rows"``                a's rows split, b whole  none                 rows split
``"allgather"``           K split on both          all-gather a and b   ``P()``, whole
``"reduce_scatter"``      K split on both          reduce-scatter C     rows split
``"2d"``                  a ``P(x, y)``,           all-gather a over    ``P(x, y)``
                          b ``P(x, y)``            y, b over x
``"auto"``                a rows over x, b         ``jax.jit`` decides  as XLA chose
                          columns over y (1-D:
                          a rows, b whole)
========================  =======================  ===================  ==================

``"2d"`` is SUMMA with each panel gathered whole: device ``(i, j)`` needs row block ``i``
of ``a`` and column block ``j`` of ``b`` over all of ``K``, gathered along the other axis,
then multiplies locally; it needs a 2-D mesh ``(x, y)``, as ``"auto"`` does for its
split of ``b`` (on a 1-D mesh ``"auto"`` splits ``a``'s rows only). A shape that does not divide
over the devices it is split across raises ``ValueError`` naming it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.feed._shardings import place_host

__all__ = ["MATMUL_STRATEGIES", "MatmulStrategy", "bytes_moved", "layouts", "matmul"]

MatmulStrategy = Literal["replicated", "rows", "allgather", "reduce_scatter", "2d", "auto"]
"""How ``matmul`` splits ``[M, K] @ [K, N]`` over the mesh (the module docstring's table)."""
MATMUL_STRATEGIES: tuple[MatmulStrategy, ...] = (
    "replicated",
    "rows",
    "allgather",
    "reduce_scatter",
    "2d",
    "auto",
)
"""Every ``MatmulStrategy``, in the order ``meshfeed bench matmul`` times them."""


def _place(x: Any, sharding: NamedSharding) -> jax.Array:
    """``x`` (the same numpy value on every process, or a jax.Array) in ``sharding``."""
    if isinstance(x, jax.Array):
        return jax.device_put(x, sharding)
    return place_host(np.asarray(x), sharding)


def _divides(size: int, parts: int, what: str, strategy: str, axes: Any) -> None:
    if size % parts:
        raise ValueError(
            f"matmul strategy {strategy!r} splits {what} ({size}) over the {parts} devices "
            f"of mesh axes {axes}; {size} is not divisible by {parts}. Pad it to a "
            f"multiple of {parts}, or pick another strategy."
        )


def layouts(mesh: Mesh, strategy: MatmulStrategy) -> tuple[P, P, P]:
    """The specs of ``a``, ``b`` and the product under ``strategy`` on ``mesh``."""
    every = tuple(mesh.axis_names)
    if strategy == "replicated":
        return P(), P(), P()
    if strategy == "rows":
        return P(every, None), P(), P(every, None)
    if strategy == "allgather":
        return P(None, every), P(every, None), P()
    if strategy == "reduce_scatter":
        return P(None, every), P(every, None), P(every, None)
    if strategy == "auto" and len(every) == 1:
        return P(every, None), P(), P(every, None)
    if strategy in ("2d", "auto"):
        if len(every) != 2:
            raise ValueError(
                f"matmul strategy {strategy!r} needs a 2-D mesh (x, y); this mesh has axes "
                f"{every}. Build one with meshfeed.make_mesh(data=4, model=2)."
            )
        x, y = every
        if strategy == "2d":
            return P(x, y), P(x, y), P(x, y)
        return P(x, None), P(None, y), P(x, y)
    raise ValueError(f"strategy={strategy!r} is unknown; pass one of {list(MATMUL_STRATEGIES)}.")


def bytes_moved(mesh: Mesh, strategy: MatmulStrategy, m: int, k: int, n: int, itemsize: int) -> int:
    """Bytes the strategy's collectives send between devices, over all devices."""
    d = mesh.size
    if strategy in ("replicated", "rows"):
        return 0
    if strategy == "allgather":  # each device receives the (d-1)/d of a and b it lacks
        return (d - 1) * (m * k + k * n) * itemsize
    if strategy == "reduce_scatter":  # each device sends (d-1)/d of its partial M x N
        return (d - 1) * m * n * itemsize
    if strategy == "2d":
        px, py = mesh.devices.shape
        return ((py - 1) * m * k + (px - 1) * k * n) * itemsize
    return -1  # "auto": whatever XLA chose


def _check(a: Any, b: Any, mesh: Mesh, strategy: MatmulStrategy) -> tuple[int, int, int]:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh is a {type(mesh).__name__}; pass a jax.sharding.Mesh.")
    sa, sb = np.shape(a), np.shape(b)
    if len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0]:
        raise ValueError(f"matmul takes a [M, K] and b [K, N]; got shapes {sa} and {sb}.")
    m, k, n = sa[0], sa[1], sb[1]
    spec_a, spec_b, _ = layouts(mesh, strategy)
    for array_spec, shape, name in ((spec_a, sa, "a"), (spec_b, sb, "b")):
        for dim, entry in enumerate(array_spec):
            if entry is None:
                continue
            axes = entry if isinstance(entry, tuple) else (entry,)
            parts = math.prod(mesh.shape[ax] for ax in axes)
            what = f"{name}'s {'rows' if dim == 0 else 'columns'}"
            _divides(shape[dim], parts, what, strategy, axes)
    return m, k, n


@functools.lru_cache(maxsize=64)  # one compiled program per mesh and strategy
def _program(mesh: Mesh, strategy: MatmulStrategy) -> Callable[[jax.Array, jax.Array], jax.Array]:
    every = tuple(mesh.axis_names)
    spec_a, spec_b, spec_out = layouts(mesh, strategy)
    if strategy == "auto":
        return jax.jit(jnp.matmul)

    def local(a: jax.Array, b: jax.Array) -> jax.Array:
        if strategy in ("replicated", "rows"):
            return a @ b
        if strategy == "allgather":
            a = jax.lax.all_gather(a, every, axis=1, tiled=True)
            b = jax.lax.all_gather(b, every, axis=0, tiled=True)
            return a @ b
        if strategy == "reduce_scatter":
            return jax.lax.psum_scatter(a @ b, every, scatter_dimension=0, tiled=True)
        x, y = every  # "2d"
        a = jax.lax.all_gather(a, y, axis=1, tiled=True)
        b = jax.lax.all_gather(b, x, axis=0, tiled=True)
        return a @ b

    mapped = jax.shard_map(
        local, mesh=mesh, in_specs=(spec_a, spec_b), out_specs=spec_out, check_vma=False
    )
    return jax.jit(mapped)


def matmul(a: Any, b: Any, *, mesh: Mesh, strategy: MatmulStrategy = "auto") -> jax.Array:
    """``a @ b`` computed across ``mesh`` with ``strategy`` (see the module docstring).

    Args:
      a: ``[M, K]``; numpy (the same value on every process) or a ``jax.Array``.
      b: ``[K, N]``.
      mesh: the devices; ``"2d"`` and ``"auto"`` need two axes.
      strategy: one of ``MATMUL_STRATEGIES``.

    Returns:
      The ``[M, N]`` product, laid out as ``layouts(mesh, strategy)[2]`` says.
    """
    if strategy not in MATMUL_STRATEGIES:
        raise ValueError(
            f"strategy={strategy!r} is unknown; pass one of {list(MATMUL_STRATEGIES)}."
        )
    _check(a, b, mesh, strategy)
    spec_a, spec_b, _ = layouts(mesh, strategy)
    a = _place(a, NamedSharding(mesh, spec_a))
    b = _place(b, NamedSharding(mesh, spec_b))
    return _program(mesh, strategy)(a, b)
