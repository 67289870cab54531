"""The context layout: a fixed permutation of a row's tokens that balances causal
attention over a context mesh axis.

A row split over ``cp`` devices in order gives the last device the most work: with
causal attention a token attends to every token before it, so the device holding a
row's last quarter does about seven times the work of the one holding its first. Two
fixed permutations even it out, and both are what the field's kernels expect:

- ``"dual_chunk"`` (MaxText's ``reorder_sequence``, Transformer Engine's
  ``DualChunkSwap``): the row cut into ``2·cp`` chunks; device ``i`` holds chunks ``i``
  and ``2·cp-1-i``, one cheap and one dear. Needs ``T % (2·cp) == 0``.
- ``"striped"`` (Transformer Engine's ``Striped``): the row dealt round-robin to the
  devices in stripes of ``stripe`` tokens. Needs ``T % (cp·stripe) == 0``.

``order(T, cp, kind, stripe)[j]`` is the position in the original row of the token at
position ``j`` of the laid-out row, so ``laid_out = row[order]`` and ``row =
laid_out[inverse(order)]``; an even split of the laid-out row over ``cp`` devices gives
device ``i`` the positions ``j`` in ``[i·T/cp, (i+1)·T/cp)``. Numpy only: the host lays
rows out (``meshfeed.sources.context_layout``), the devices restore outputs
(``meshfeed.train.restore_order``) with the same permutation.
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np

ContextKind = Literal["dual_chunk", "striped"]
"""A context layout: ``"dual_chunk"`` or ``"striped"`` (the module docstring)."""
KINDS: tuple[str, ...] = ("dual_chunk", "striped")


def check_layout(length: int | None, cp: object, kind: object, stripe: object) -> None:
    """Raises ``ValueError``/``TypeError`` naming the argument and the fix, for a layout
    of rows of ``length`` tokens (``None``: the rows' length is not checked)."""
    if isinstance(cp, bool) or not isinstance(cp, int | np.integer) or cp < 1:
        raise ValueError(f"cp={cp!r} must be an int >= 1 (devices on the context axis).")
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not a context layout; pass one of {list(KINDS)}.")
    if isinstance(stripe, bool) or not isinstance(stripe, int | np.integer) or stripe < 1:
        raise ValueError(f"stripe={stripe!r} must be an int >= 1 (tokens dealt at a time).")
    if kind == "dual_chunk" and stripe != 1:
        raise ValueError(
            f"stripe={stripe} is for kind='striped'; the dual chunk layout cuts 2·cp chunks "
            "and takes no stripe."
        )
    if length is None:
        return
    unit = 2 * int(cp) if kind == "dual_chunk" else int(cp) * int(stripe)
    if length % unit:
        what = "2·cp" if kind == "dual_chunk" else "cp·stripe"
        lower, upper = length - length % unit, length - length % unit + unit
        raise ValueError(
            f"rows of {length} tokens do not split into the {unit} pieces ({what}) of the "
            f"{kind} layout for cp={cp}; pack rows of a multiple of {unit} tokens (seq_len="
            f"{lower or unit} or {upper}), or use another cp"
            + (" or stripe." if kind == "striped" else ".")
        )


@functools.lru_cache(maxsize=64)
def _order(length: int, cp: int, kind: str, stripe: int) -> np.ndarray:
    if kind == "dual_chunk":
        chunk = length // (2 * cp)
        chunks = np.stack([np.arange(cp), 2 * cp - 1 - np.arange(cp)], axis=1).reshape(-1)
        out = (chunks[:, None] * chunk + np.arange(chunk)).reshape(-1)
    else:
        per_device = length // cp
        w = np.arange(per_device)
        device = np.arange(cp)[:, None]
        out = ((w // stripe) * (cp * stripe) + device * stripe + w % stripe).reshape(-1)
    out = out.astype(np.int64)
    out.flags.writeable = False
    return out


def order(length: int, cp: int, kind: ContextKind, stripe: int = 1) -> np.ndarray:
    """Position in the original row of each position of the laid-out row (``int64``
    ``[length]``, read-only); checked as ``check_layout``."""
    check_layout(length, cp, kind, stripe)
    return _order(int(length), int(cp), str(kind), int(stripe))


def inverse(length: int, cp: int, kind: ContextKind, stripe: int = 1) -> np.ndarray:
    """Position in the laid-out row of each position of the original row: ``row =
    laid_out[inverse(...)]``."""
    forward = order(length, cp, kind, stripe)
    out = np.empty_like(forward)
    out[forward] = np.arange(length)
    return out
