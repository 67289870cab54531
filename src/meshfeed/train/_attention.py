"""Attention that stays inside each document of a packed row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


def segment_mask(segment_ids: ArrayLike, *, causal: bool = True) -> jax.Array:
    """``[..., L, L]`` booleans: may token ``i`` (query) attend to token ``j`` (key)?

    True only inside one document (equal, non-zero segment ids) and, with ``causal``,
    only backwards (``j <= i``). Padding (segment id 0) attends nowhere and is attended
    by nothing: its rows are all False, so mask the scores with a large negative number
    (not ``-inf``) or drop those rows' outputs, which the loss ignores anyway.

    Args:
      segment_ids: ``[..., L]`` integers, as ``meshfeed.pack`` gives them.
      causal: also forbid attending to later tokens.

    Example:
      >>> mask = segment_mask(batch["segment_ids"])[:, None]  # [batch, heads, L, L]
      >>> scores = jnp.where(mask, scores, -1e9)  # doctest: +SKIP
    """
    ids = jnp.asarray(segment_ids)
    mask = (ids[..., :, None] == ids[..., None, :]) & (ids[..., :, None] > 0)
    if causal:
        length = ids.shape[-1]
        mask = mask & jnp.tril(jnp.ones((length, length), dtype=bool))
    return mask
