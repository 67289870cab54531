"""A context layout undone on the devices: ``restore_order``.

The loader lays each packed row out for a context mesh axis on the host
(``meshfeed.sources.context_layout``); a model's outputs then come in that order. A loss
per token needs nothing undone (its targets were laid out with it), but anything read
in the row's own order -- logits to decode, activations to compare -- goes back through
the inverse permutation, one ``take`` along the sequence axis.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from meshfeed.core._context_layout import ContextKind, inverse


def restore_order(
    x: ArrayLike, cp: int, kind: ContextKind = "dual_chunk", stripe: int = 1, *, axis: int = 1
) -> jax.Array:
    """``x`` laid out by a context layout, back in the row's own order along ``axis``.

    Args:
      x: an array whose ``axis`` is a laid-out row (``[batch, T, ...]`` by default).
      cp, kind, stripe: the layout, as ``meshfeed.sources.context_layout`` took them.
      axis: the sequence axis.

    Example:
      >>> logits = model(batch["tokens"])  # laid out  # doctest: +SKIP
      >>> logits = meshfeed.train.restore_order(logits, cp=4)  # doctest: +SKIP
    """
    x = jnp.asarray(x)
    return jnp.take(x, jnp.asarray(inverse(x.shape[axis], cp, kind, stripe)), axis=axis)
