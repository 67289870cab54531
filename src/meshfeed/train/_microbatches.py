"""A step's rows cut into microbatches, and every part of the loss weighted by its count.

A step's update is the gradient of the mean loss over everything the step counts: the
valid rows, or -- when ``loss_fn`` says so with ``metrics["count"]`` -- its loss
tokens. Whatever computes part of that mean (a device in ``shard_map``/``pmap``, a
microbatch inside a step) returns its own mean and count; ``weighted_sums`` turns
them into sums (``mean * count``) added up over the microbatches with ``lax.scan``, and
the caller divides by the total count, after a ``psum`` over the devices in the manual
modes. The sum of the parts' means would be another loss (a short document's tokens
weighing more than a long one's); this is the same loss as the one big step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from meshfeed.data._pack import LOSS_MASK
from meshfeed.data._pack_fields import SEGMENT_IDS
from meshfeed.train._step_parts import COUNT, Batch, averaged, step_key, valid_rows

Sums = dict[str, Any]
"""``{"loss": ..., "aux": {...}, "grads": ...}``, each a weighted sum."""


def weight_of(aux: Any, batch: Batch) -> jax.Array:
    """What the loss averaged over: ``aux["count"]`` when given, else the valid rows."""
    if isinstance(aux, dict) and COUNT in aux:
        return jnp.asarray(aux[COUNT], jnp.float32)
    return valid_rows(batch)


def check_microbatches(microbatches: object) -> int:
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise ValueError(f"microbatches={microbatches!r} must be a positive int (1: no split).")
    return microbatches


def split_rows(batch: Batch, microbatches: int, shards: int = 1) -> dict[str, jax.Array]:
    """Each field ``[rows, ...]`` as ``[microbatches, rows / microbatches, ...]``.

    With ``shards`` (the row blocks of the batch's sharding), microbatch ``m`` takes the
    ``m``-th part of every block, so each device keeps its own rows and nothing moves.
    """
    out = {}
    for name, x in batch.items():
        rows = x.shape[0]
        if rows % (shards * microbatches):
            per = (
                f"{rows // shards} rows on each of {shards} devices"
                if shards > 1
                else (f"{rows} rows")
            )
            raise ValueError(
                f"microbatches={microbatches} must divide each device's rows; field "
                f"{name!r} has {per}. Pass a global_batch_size that is a multiple of "
                f"{shards * microbatches}, or fewer microbatches."
            )
        x = x.reshape(shards, microbatches, rows // (shards * microbatches), *x.shape[1:])
        out[name] = jnp.swapaxes(x, 0, 1).reshape(microbatches, rows // microbatches, *x.shape[3:])
    return out


def weighted_sums(
    grads: Callable[..., Any],
    microbatches: int,
    split: Callable[[Batch], Batch],
    *,
    warn_rows: bool,
    pick: Callable[[Batch], Batch] = lambda b: b,
) -> Callable[..., tuple[jax.Array, Sums, Any]]:
    """``(params, batch, model_state, key) -> (count, sums, model_state)``.

    Runs ``grads`` on each microbatch (``split(batch)``, then ``pick`` of each slice: a
    sharding constraint under ``jit``) in order, the model state carried from one to the
    next, each microbatch's key ``fold_in(key, m)``. ``warn_rows``: the parts will be
    weighted against each other, so a packed batch whose loss says no count is warned of.
    """

    def one(params: Any, batch: Batch, model_state: Any, key: Any) -> Any:
        loss, aux, model_state, g = grads(params, batch, model_state, key)
        if warn_rows:
            _warn_unless_counted(aux, batch)
        w = weight_of(aux, batch)
        return w, _scaled({"loss": loss, "aux": aux, "grads": g}, w), model_state

    if microbatches == 1:
        return one

    def run(params: Any, batch: Batch, model_state: Any, key: Any) -> Any:
        parts = split(batch)

        def body(carry: Any, xs: Any) -> Any:
            total, sums, state = carry
            m, part = xs
            part_key = None if key is None else jax.random.fold_in(key, m)
            w, part_sums, new_state = one(params, pick(part), state, part_key)
            new_state = jax.tree.map(lambda n, o: jnp.asarray(n, o.dtype), new_state, state)
            sums = jax.tree.map(lambda a, b: a + b.astype(a.dtype), sums, part_sums)
            return (total + w, sums, new_state), None

        first = jax.tree.map(lambda x: x[0], parts)
        shapes = jax.eval_shape(one, params, pick(first), model_state, key)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, _accumulated(s.dtype)), shapes[1])
        start = (jnp.zeros((), jnp.float32), zeros, model_state)
        steps = jnp.arange(microbatches)
        (total, sums, model_state), _ = jax.lax.scan(body, start, (steps, parts))
        return total, sums, model_state

    return run


def means(total: jax.Array, sums: Sums, dtypes: Any) -> tuple[jax.Array, dict, Any]:
    """``(loss, metrics, grads)`` from the summed parts and their total count.

    ``metrics["count"]``, when the loss gave one, is the step's total count.
    """
    safe = jnp.where(total > 0, total, 1.0)
    loss = sums["loss"] / safe
    aux = jax.tree.map(lambda v: v / safe, sums["aux"])
    if isinstance(aux, dict) and COUNT in aux:
        aux = {**aux, COUNT: total}
    grads = jax.tree.map(lambda v, d: (v / safe).astype(d), sums["grads"], dtypes)
    return loss, aux, grads


def local_step(
    grads: Callable[..., Any],
    apply: Callable[..., Any],
    axes: tuple[str, ...],
    microbatches: int = 1,
) -> Callable[..., Any]:
    """The per-device step of shard_map and pmap: each device's parts summed, weighted by
    their counts, and the sums added over the devices before the one division."""
    sums_of = weighted_sums(
        grads, microbatches, lambda b: split_rows(b, microbatches), warn_rows=True
    )

    def local(
        step: jax.Array, params: Any, opt_state: Any, model_state: Any, rng: Any, batch: Batch
    ) -> Any:
        count, sums, model_state = sums_of(params, batch, model_state, step_key(rng, step, axes))
        total = jax.lax.psum(count, axes)
        loss, aux, g = means(total, jax.lax.psum(sums, axes), dtypes_of(params))
        rows = valid_rows(batch)
        model_state = averaged(model_state, rows, jnp.maximum(jax.lax.psum(rows, axes), 1.0), axes)
        params, opt_state = apply(params, opt_state, g)
        return step + 1, params, opt_state, model_state, {"loss": loss, **aux}

    return local


def dtypes_of(tree: Any) -> Any:
    return jax.tree.map(lambda x: jnp.result_type(x), tree)


def _scaled(tree: Any, w: jax.Array) -> Any:
    return jax.tree.map(lambda v: v * w.astype(_accumulated(jnp.result_type(v))), tree)


def _accumulated(dtype: Any) -> Any:
    """Sums of float16/bfloat16 parts kept in float32; others in their own type."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.promote_types(dtype, jnp.float32)
    return jnp.float32


def _warn_unless_counted(aux: Any, batch: Batch) -> None:
    if (isinstance(aux, dict) and COUNT in aux) or not ({LOSS_MASK, SEGMENT_IDS} & set(batch)):
        return
    warnings.warn(
        "the batch holds loss_mask or segment_ids, but loss_fn's metrics have no "
        "'count': the parts of this step (devices, microbatches) are weighted by their "
        "rows, so the update is not the mean over the step's loss tokens. Return "
        "(loss, {'count': tokens_counted, ...}) with the number of tokens the loss "
        "averages over.",
        stacklevel=2,
    )
