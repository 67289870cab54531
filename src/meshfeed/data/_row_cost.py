"""A packed row's cost, as the attention kernel sees it.

In a synchronous step every data-parallel device waits for the slowest, and with packed
long rows a row's work is not its token count: attention over one document of ``L``
tokens costs about ``L(L+1)/2`` query-key pairs under a causal mask, so a row holding one
32k document costs far more than a row of sixty-four 512-token ones. What a row costs
depends on the kernel, so ``balance`` names it:

- ``"pairs"``: ``Σ L(L+1)/2`` over the row's segments -- kernels that skip the work
  between documents and above the diagonal (cuDNN, Transformer Engine, tokamax on GPU,
  ``meshfeed.train.packed_attention``);
- ``"static"``: every row the cost of a full one, ``T(T+1)/2`` -- kernels that do the
  whole row whatever it holds (splash attention on TPU), where balancing reduces to
  padding;
- a function of a row's segment lengths (an ``int64`` array) giving its cost.

``token_cost`` adds a share per token to each: the work that grows with tokens alone
(the projections and the MLP). For a transformer of width ``d`` an attention pair costs
about ``4d`` flops and a token ``24d²`` in its dense layers, so ``token_cost ≈ 6d`` in
pairs.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable
from typing import Literal, TypeAlias

import numpy as np

BalanceKind: TypeAlias = Literal["pairs", "static"]
Balance: TypeAlias = BalanceKind | Callable[[np.ndarray], float]
"""What a packed row costs: ``"pairs"``, ``"static"``, or a function of the row's segment
lengths (the module docstring)."""
BALANCES: tuple[str, ...] = ("pairs", "static")


def check_balance(balance: object, token_cost: object) -> None:
    """Raises ``ValueError``/``TypeError`` naming the argument and the fix."""
    if not (balance in BALANCES or callable(balance)):
        raise ValueError(
            f"balance={balance!r} is not a cost model; pass 'pairs' (attention that skips "
            "work between documents), 'static' (every row costs a full one) or a function "
            "of a row's segment lengths."
        )
    if isinstance(token_cost, bool) or not isinstance(token_cost, numbers.Real):
        raise TypeError(f"token_cost={token_cost!r} must be a number (cost per token).")
    if not np.isfinite(float(token_cost)) or token_cost < 0:
        raise ValueError(f"token_cost={token_cost!r} must be finite and >= 0.")


def row_costs(
    counts: np.ndarray,
    lengths: np.ndarray,
    seq_len: int,
    balance: Balance,
    token_cost: float = 0.0,
) -> np.ndarray:
    """Each row's cost (``float64``), from its pieces: how many each row has (``counts``)
    and their lengths, row after row (what ``PackPlan.pieces_of`` gives)."""
    counts = np.asarray(counts, np.int64)
    if balance == "static":
        attention = np.full(len(counts), seq_len * (seq_len + 1) / 2)
        return attention + token_cost * seq_len
    if balance == "pairs":
        real = np.asarray(lengths, np.float64)
        attention = _per_row(real * (real + 1), counts) * 0.5
    elif callable(balance):
        lengths = np.asarray(lengths, np.int64)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        attention = np.fromiter(
            (float(balance(lengths[a:b])) for a, b in itertools.pairwise(bounds)),
            np.float64,
            len(counts),
        )
    else:  # pragma: no cover - check_balance refuses it first
        raise ValueError(f"balance={balance!r} is not a cost model.")
    if token_cost:
        attention += token_cost * _per_row(np.asarray(lengths, np.float64), counts)
    return attention


def _per_row(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Sums of ``values`` by row (``counts`` a row, rows of none summing to 0), each row
    summed on its own (no running total to lose digits to)."""
    out = np.zeros(len(counts), np.float64)
    held = counts > 0
    if held.any():
        out[held] = np.add.reduceat(values, (np.cumsum(counts) - counts)[held], dtype=np.float64)
    return out
