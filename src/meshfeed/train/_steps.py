"""Train steps: one builder, three ways to run the same data-parallel step.

``make_train_step(loss_fn, optimizer, mesh=..., mode=...)`` returns
``step(state, batch) -> (state, metrics)``. The three modes are the three idioms of the
JAX guides, and they give the same parameters:

``"jit"``
    automatic SPMD: ``jax.jit`` over the global batch as the loader laid it out, with the
    parameters replicated or sharded however the user placed them (hybrid data + model
    parallel: e.g. a kernel with ``P(None, 'model')``). ``loss_fn`` sees the global batch.
``"shard_map"``
    manual SPMD: ``jax.shard_map`` runs ``loss_fn`` and its gradient on each device's
    rows; gradients are combined with ``psum`` over the batch axes.
``"pmap"``
    the legacy idiom: parameters broadcast with ``in_axes=None``, the batch reshaped to
    ``[devices, device_batch_size, ...]``, gradients averaged with ``pmean``-style collectives,
    replicated outputs with ``out_axes=None``.

What every mode computes (the gradient, the valid-row weighting, the keys) is
``_step_parts``; the ``pmap`` mode is ``_pmap_step``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from meshfeed.core._mesh import DATA, num_batch_shards
from meshfeed.train._microbatches import (
    check_microbatches,
    dtypes_of,
    local_step,
    means,
    split_rows,
    weighted_sums,
)
from meshfeed.train._pmap_step import pmap_step
from meshfeed.train._step_parts import (
    MODES,
    Batch,
    LossFn,
    Mode,
    check_batch_specs,
    gradient,
    shardings_of,
    step_key,
)
from meshfeed.train._train_state import TrainState


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    mesh: Mesh,
    mode: Mode = "jit",
    batch_axes: Sequence[str] = (DATA,),
    stateful: bool = False,
    donate: bool = True,
    microbatches: int = 1,
) -> TrainStep:
    """Builds ``step(state, batch) -> (state, metrics)`` for one of three modes.

    Args:
      loss_fn: ``loss_fn(params, batch) -> (loss, aux)``: the mean loss over the valid
        rows of ``batch`` (see ``masked_mean``) and a dict of scalar metrics. With
        ``stateful=True``: ``loss_fn(params, batch, model_state, rng) ->
        (loss, (aux, new_model_state))``, where ``model_state`` and ``rng`` come from the
        ``TrainState`` (``rng`` is this step's key, ``None`` when the state has none).
      optimizer: an optax ``GradientTransformation``.
      mesh: the mesh the batch and the state live on.
      mode: ``"jit"``, ``"shard_map"`` or ``"pmap"``.
      batch_axes: mesh axes the batch dimension is split over. ``"pmap"`` needs them to
        cover every device of the mesh (one batch shard per device).
      stateful: ``loss_fn`` takes and returns model state and takes a key. In the
        manual modes each device gets its own key, and the floating-point leaves of the
        new model state are averaged over the batch axes weighted by valid rows (equal
        to ``jit``'s global statistics when ``loss_fn`` computes them with collectives
        over ``collective_axes(mode, batch_axes)``, and their average otherwise).
      donate: the step *donates* the state it is given: XLA writes the new parameters
        and optimizer state into the old ones' memory, so a step holds one copy of the
        state, not two, and after it the old state's arrays are deleted (reading one
        raises). Keep a state you still need with ``jax.tree.map(jnp.copy, state)``
        before the step, or pass ``donate=False``.

      microbatches: cut each device's rows of a step into this many microbatches, run
        one after another inside the step (``lax.scan``), their gradients summed: the
        activations of one microbatch are held at a time, the update is the one big
        step's. Each device's rows must divide by it. With a loss averaged over tokens,
        return ``metrics["count"]`` (below) so the parts add up to the step's mean.

    What the loss counts: ``loss_fn`` returns a mean. When that mean is over something
    other than the valid rows -- the loss tokens of packed rows or of a ``loss_mask`` --
    put their number in the metrics, ``(loss, {"count": tokens, ...})``: then each part
    of a step (a device's rows under ``shard_map`` and ``pmap``, a microbatch) is weighted
    by its count, and every mode and every ``microbatches`` gives the update of the mean
    over all the step's tokens, as ``jit`` computes it on the global batch. Without a
    count the parts are weighted by their valid rows (a warning says so when the batch
    has ``loss_mask`` or ``segment_ids``). ``metrics["count"]`` comes back as the step's
    total.

    Returns:
      The step, a ``TrainStep``; ``metrics`` holds ``"loss"`` and the aux entries,
      replicated scalars. The new state keeps the layout of the state passed in. Each
      mode compiles once for a given batch shape.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; pass one of {list(MODES)}.")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh is a {type(mesh).__name__}; pass a jax.sharding.Mesh.")
    axes = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    missing = [a for a in axes if a not in mesh.axis_names]
    if not axes or missing:
        raise ValueError(
            f"batch_axes={axes} must name axes of the mesh {dict(mesh.shape)}; "
            f"{missing or 'none'} are not; pass e.g. batch_axes=('data',)."
        )
    if mode == "pmap" and math.prod(mesh.shape[a] for a in axes) != mesh.size:
        raise ValueError(
            f"mode='pmap' puts one batch shard on each device, but batch_axes={axes} "
            f"cover {math.prod(mesh.shape[a] for a in axes)} of the {mesh.size} devices of "
            f"mesh {dict(mesh.shape)}; pass batch_axes={tuple(mesh.axis_names)}, or use "
            "mode='jit' for hybrid data + model parallelism."
        )
    grads = gradient(loss_fn, stateful)

    def apply(params: Any, opt_state: Any, grads: Any) -> tuple[Any, Any]:
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    if not isinstance(donate, bool):
        raise TypeError(f"donate={donate!r} must be True or False.")
    microbatches = check_microbatches(microbatches)
    lower = None
    if mode == "jit":
        built, lower = _jit_step(grads, apply, mesh, donate, microbatches)
    elif mode == "shard_map":
        built = _shard_map_step(grads, apply, mesh, axes, donate, microbatches)
    else:
        built = pmap_step(grads, apply, mesh, axes, donate, microbatches)
    return TrainStep(built, lower, mode, stateful)


class TrainStep:
    """A train step from ``make_train_step``: ``step(state, batch) -> (state, metrics)``.

    ``step.lower(state, batch)`` (``mode="jit"``) is the step lowered for such
    arguments without running it -- they may be ``jax.ShapeDtypeStruct`` leaves with
    shardings, so nothing is allocated -- and ``.compile().memory_analysis()`` says what
    each device holds during it (arguments, outputs, what the donation reuses, temporaries).
    """

    def __init__(self, run: Callable[..., Any], lower: Any, mode: Mode, stateful: bool) -> None:
        self._run, self._lower, self.mode, self._stateful = run, lower, mode, stateful

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        if not self._stateful and (state.model_state is not None or state.rng is not None):
            raise ValueError(
                "the state holds model_state or rng, which loss_fn(params, batch) cannot "
                "see; pass stateful=True and write loss_fn(params, batch, model_state, rng)"
                " -> (loss, (metrics, new_model_state))."
            )
        if _donated(state):
            raise ValueError(
                "the state was donated to an earlier step, and its buffers are gone: pass "
                "the state that step returned (fit's history.state), or build the step with "
                "make_train_step(..., donate=False) to keep every state."
            )
        return self._run(state, batch)

    def lower(self, state: Any, batch: Any) -> Any:
        """The step lowered for ``state`` and ``batch`` (``jax.stages.Lowered``)."""
        if self._lower is None:
            raise NotImplementedError(
                f"step.lower is for mode='jit'; this step is mode={self.mode!r}. Build one "
                "with mode='jit' to look at its compiled memory."
            )
        return self._lower(state, batch)


def _donated(state: Any) -> bool:
    """Whether ``state``'s buffers went to an earlier step (one leaf says it for all)."""
    for leaf in jax.tree_util.tree_leaves(getattr(state, "params", state)):
        if isinstance(leaf, jax.Array):
            return leaf.is_deleted()
    return False


def _jit_step(
    grads: Callable[..., Any],
    apply: Callable[..., Any],
    mesh: Mesh,
    donate: bool,
    microbatches: int,
) -> tuple[Any, Any]:
    def whole(state: TrainState, batch: Batch) -> tuple[Any, Any, Any, Any]:
        key = step_key(state.rng, state.step)
        return grads(state.params, batch, state.model_state, key)

    def step_fn(
        state: TrainState, batch: Batch, split: Any = None
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        if split is None:
            loss, aux, model_state, g = whole(state, batch)
        else:
            key = step_key(state.rng, state.step)
            total, sums, model_state = split(state.params, batch, state.model_state, key)
            loss, aux, g = means(total, sums, dtypes_of(state.params))
        params, opt_state = apply(state.params, state.opt_state, g)
        new = TrainState(state.step + 1, params, opt_state, model_state, state.rng)
        return new, {"loss": loss, **aux}

    compiled: dict[Any, Any] = {}
    replicated = NamedSharding(mesh, P())

    def jitted(state: Any, batch: Any) -> Any:
        split = None if microbatches == 1 else _jit_microbatches(grads, microbatches, batch)
        # Pin the state's layout so every step's output feeds the next without a new
        # compilation (XLA would otherwise be free to pick another layout).
        return jax.jit(
            lambda s, b: step_fn(s, b, split),
            out_shardings=(shardings_of(state), replicated),
            donate_argnums=(0,) if donate else (),
        )

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        key = _layout_key(batch) if microbatches > 1 else None
        if key not in compiled:
            compiled[key] = jitted(state, batch)
        return compiled[key](state, batch)

    def lower(state: Any, batch: Any) -> Any:
        return jitted(state, batch).lower(state, batch)

    return step, lower


def _layout_key(batch: Batch) -> tuple[Any, ...]:
    return tuple((name, getattr(x, "sharding", None)) for name, x in sorted(batch.items()))


def _jit_microbatches(grads: Callable[..., Any], microbatches: int, batch: Batch) -> Any:
    """``weighted_sums`` over the global batch: microbatch ``m`` is the ``m``-th part of
    every device's rows, held in the field's own layout, so no row moves."""
    shardings = {name: getattr(x, "sharding", None) for name, x in batch.items()}

    def split(b: Batch) -> dict[str, jax.Array]:
        out = {}
        for name, x in b.items():
            sharding = shardings[name]
            if not isinstance(sharding, NamedSharding):
                out[name] = split_rows({name: x}, microbatches)[name]
                continue
            parts = split_rows({name: x}, microbatches, num_batch_shards(sharding))[name]
            stacked = NamedSharding(sharding.mesh, P(None, *sharding.spec))
            out[name] = jax.lax.with_sharding_constraint(parts, stacked)
        return out

    def pick(part: Batch) -> dict[str, jax.Array]:
        return {
            name: x
            if not isinstance(shardings[name], NamedSharding)
            else jax.lax.with_sharding_constraint(x, shardings[name])
            for name, x in part.items()
        }

    return weighted_sums(grads, microbatches, split, warn_rows=True, pick=pick)


def _shard_map_step(
    grads: Callable[..., Any],
    apply: Callable[..., Any],
    mesh: Mesh,
    axes: tuple[str, ...],
    donate: bool,
    microbatches: int,
) -> Any:
    local = local_step(grads, apply, axes, microbatches)
    compiled: dict[Any, Any] = {}
    replicated = NamedSharding(mesh, P())

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        key = tuple(sorted(batch))
        if key not in compiled:
            specs = check_batch_specs(batch, mesh, axes, "shard_map")
            # check_vma=False: the classic semantics, where each device's gradient is its
            # own and the psum below is the only reduction.
            mapped = jax.shard_map(
                local,
                mesh=mesh,
                in_specs=(P(), P(), P(), P(), P(), specs),
                out_specs=(P(), P(), P(), P(), P()),
                check_vma=False,
            )
            # Parameters enter whole; the outputs go back to the state's layout (a
            # kernel over 'model' stays over 'model').
            kept = shardings_of((state.step, state.params, state.opt_state, state.model_state))
            # The key is not donated: the new state keeps it (each step folds in its number).
            compiled[key] = jax.jit(
                mapped,
                out_shardings=(*kept, replicated),
                donate_argnums=(0, 1, 2, 3) if donate else (),
            )
        new_step, params, opt_state, model_state, metrics = compiled[key](
            state.step, state.params, state.opt_state, state.model_state, state.rng, dict(batch)
        )
        return TrainState(new_step, params, opt_state, model_state, state.rng), metrics

    return step
