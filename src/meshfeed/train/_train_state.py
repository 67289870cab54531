"""The train state: what a step reads and returns, placed on a mesh.

``TrainState`` holds the step count, the trainable parameters and the optimizer state,
and for models that have them, two more things a step needs: ``model_state``, values
the forward pass updates but the optimizer does not touch (BatchNorm's running
statistics, a counter), and ``rng``, a typed random key. The key is never advanced in
place: each step draws ``fold_in(rng, step)`` (and, in the manual modes, folds in the
device's index along the batch axes), so a step's randomness depends only on the seed
and the step number -- a resumed run draws what the uninterrupted one drew.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.feed._shardings import place_host
from meshfeed.train._param_sharding import ParamSharding, lay_out, optimizer_state, place
from meshfeed.train._param_sharding import check as check_param_sharding


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Step count, parameters, optimizer state, and optional model state and key."""

    step: jax.Array
    params: Any
    opt_state: Any
    model_state: Any = None
    """Non-trainable values the loss updates (batch statistics); ``None`` without."""
    rng: jax.Array | None = None
    """A typed key (``jax.random.key``); each step uses ``fold_in(rng, step)``."""

    @classmethod
    def create(
        cls,
        params: Any,
        optimizer: optax.GradientTransformation,
        *,
        mesh: Mesh,
        model_state: Any = None,
        rng: int | jax.Array | None = None,
        param_sharding: ParamSharding = None,
    ) -> TrainState:
        """Places ``params`` (and ``model_state``) on ``mesh`` and initialises the optimizer.

        Leaves that are already ``jax.Array`` with a ``NamedSharding`` on ``mesh`` keep
        their layout (hybrid: place a kernel with ``P(None, 'model')`` first); all other
        leaves are replicated. Every process must pass the same values. The optimizer
        state follows the parameters' layout. ``rng`` is a seed or a key
        (``jax.random.key(0)``; a raw ``uint32[2]`` key is wrapped).

        ``param_sharding="fsdp"`` splits every parameter of at least 2^16 elements, and
        its optimizer state, over the ``'data'`` axis as well (fully sharded data
        parallel: each device holds 1/n of them, on the largest dimension n divides;
        a kernel already over ``'model'`` gets ``'data'`` on another dimension). A
        callable ``param_sharding(path, leaf) -> PartitionSpec | None`` lays out each
        parameter itself (``None``: the default for that one). Steps compute the same
        values whatever the layout.

        The state takes the arrays it is given: a step donates them (see
        ``make_train_step``), so copy a ``jax.Array`` you pass here if you need it after.
        """
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh is a {type(mesh).__name__}; pass a jax.sharding.Mesh.")
        check_param_sharding(param_sharding, mesh)
        replicated = NamedSharding(mesh, P())
        params = lay_out(params, mesh, param_sharding)
        if param_sharding is None:
            # Leaves that do not derive from params (Adam's count) come out on one device.
            opt_state = jax.tree.map(lambda x: place(x, mesh), jax.jit(optimizer.init)(params))
        else:
            opt_state = optimizer_state(optimizer, params, mesh)
        step = place_host(np.zeros((), np.int32), replicated)
        model_state = jax.tree.map(lambda x: place(x, mesh), model_state)
        key = None if rng is None else place_key(typed_key(rng), replicated)
        return cls(step=step, params=params, opt_state=opt_state, model_state=model_state, rng=key)


def place_key(key: jax.Array, sharding: NamedSharding) -> jax.Array:
    """A typed key placed by ``sharding``, on any number of processes (its bits placed by
    callback, then wrapped: no cross-process ``device_put``)."""
    bits = place_host(np.asarray(jax.random.key_data(key)), sharding)
    return jax.random.wrap_key_data(bits, impl=jax.random.key_impl(key))


def typed_key(rng: int | jax.Array) -> jax.Array:
    """A typed key from a seed, a typed key, or a raw ``uint32[2]`` key."""
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return jax.random.key(int(rng))
    if isinstance(rng, jax.Array) and jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        if rng.shape:
            raise ValueError(f"rng has shape {rng.shape}; pass one key (shape ()).")
        return rng
    raw = np.asarray(rng)
    if raw.dtype == np.uint32 and raw.shape == (2,):
        return jax.random.wrap_key_data(jnp.asarray(raw))
    raise TypeError(f"rng={rng!r} is not a seed or a key; pass an int or jax.random.key(seed).")
