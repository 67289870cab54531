"""Attention that stays inside each document of a packed row: the dense mask.

``segment_mask`` builds ``[..., L, L]`` booleans: 16 MiB a row at 4,096 tokens, 1 GiB at
32k, 16 GiB at 128k. It is the simple path for short rows; past a few thousand tokens
``meshfeed.train.packed_attention`` computes the same attention a block at a time, in
memory linear in the row length, and a mask that large is said once, on stderr.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

LARGE = 4096
"""Rows this long or longer: ``segment_mask`` says ``packed_attention`` fits them better."""
_SAID: set[int] = set()


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
    length = ids.shape[-1]
    if length >= LARGE and length not in _SAID:  # said when traced, once a length
        _SAID.add(length)
        sys.stderr.write(
            f"meshfeed: segment_mask builds [{length}, {length}] booleans a row "
            f"({length * length / 2**20:,.0f} MiB); meshfeed.train.packed_attention attends "
            "inside each document with no mask, in memory linear in the row length.\n"
        )
    mask = (ids[..., :, None] == ids[..., None, :]) & (ids[..., :, None] > 0)
    if causal:
        mask = mask & jnp.tril(jnp.ones((length, length), dtype=bool))
    return mask
