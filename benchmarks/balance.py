"""Balanced steps: how evenly each rule spreads a step's attention cost over the devices."""

from __future__ import annotations

import functools
import itertools
import json
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from balance_rules import FILL, RULES
from harness import arguments
from packing import source
from scipy import stats

import meshfeed
from meshfeed.inspect import step_balance

LOW, HIGH = 137, 131_072
TOKEN_COST = 6 * 4096  # the second cost's share per token: 6 d pairs for width d = 4096
COSTS = {"pairs": 0.0, "token_cost": float(TOKEN_COST)}
# a goal met: the figure's size at most this
GOALS = dict(imbalance=1.03, padding=0.005, plan_ms_per_step=1.0, cap_violations=0, spearman=0.05)
GOAL_DEVICES = 64
ALGORITHM = "best_fit_decreasing"
SEED = 0  # of the permutations that stand in for the loader's keyed shuffles


def _log_uniform(rng: np.random.Generator, n: int, low: float, high: float) -> np.ndarray:
    return np.exp(rng.uniform(np.log(low), np.log(high), n))


MIXES: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "log_uniform": lambda rng, n: _log_uniform(rng, n, LOW, HIGH),
    "pareto": lambda rng, n: np.minimum(LOW * (1 - rng.random(n)) ** (-1 / 1.1), HIGH),
    "short_long": lambda rng, n: np.where(
        rng.random(n) < 0.95, _log_uniform(rng, n, LOW, 4096), _log_uniform(rng, n, 65536, HIGH)
    ),
}


def documents(mix: str, tokens: int, seed: int = 0) -> np.ndarray:
    """Document lengths of ``mix`` totalling at least ``tokens``."""
    rng = np.random.default_rng(seed)
    parts, total = [], 0
    while total < tokens:
        parts.append(MIXES[mix](rng, 1 << 20).astype(np.int64))
        total += int(parts[-1].sum())
    lengths = np.concatenate(parts)
    return lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]


def pieces(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """Each document cut into ``seq_len`` pieces, in order (``long_docs="split"``)."""
    count = -(-lengths // seq_len)
    at = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return np.minimum(np.repeat(lengths, count) - at * seq_len, seq_len)


def timed_pack(
    documents: meshfeed.ArraySource, seq_len: int, **balance: Any
) -> tuple[meshfeed.Packed, float]:
    start = time.perf_counter()
    packed = meshfeed.pack(
        documents, seq_len, algorithm=ALGORITHM, long_docs="split", plan_dir=False, **balance
    )
    return packed, time.perf_counter() - start


def epoch_line(lengths: np.ndarray, seq_len: int, plain: meshfeed.Packed, plan_s: float) -> dict:
    """The epoch's plan without ``balance``; its padding floor: rows for the tokens, and
    one for each piece over ``T / 2``."""
    split, tokens = pieces(lengths, seq_len), int(lengths.sum())
    rows = max(-(-tokens // seq_len), int((2 * split > seq_len).sum()))
    return {
        "algorithm": ALGORITHM,
        "window": None,
        "documents": len(lengths),
        "pieces": len(split),
        "rows": len(plain),
        "mean_document": round(float(lengths.mean()), 1),
        "mean_piece": round(tokens / len(split), 1),
        "plan_padding": round(float(plain.stats()["padding_fraction"]), 5),
        "padding_floor": round(1 - tokens / (rows * seq_len), 5),
        "plan_s": round(plan_s, 2),
    }


def served_rows(packed: meshfeed.Packed) -> dict[str, np.ndarray]:
    """A balanced pack's served rows: per row its tokens, ``sum L^2`` (from ``row_costs``:
    ``sum L(L+1)/2 = (sum L^2 + sum L) / 2``) and costs; last a 0, what an empty row (-1,
    all padding) reads."""
    ids = np.arange(len(packed))
    pairs = packed.row_costs(ids)
    tokens = packed.row_tokens(ids)
    rows = {"tokens": tokens, "squares": 2 * pairs - tokens}
    rows |= {name: pairs + token_cost * tokens for name, token_cost in COSTS.items()}
    return {name: np.append(values, 0) for name, values in rows.items()}


def deal(costs: np.ndarray, devices: int) -> np.ndarray:
    """Per step (a row of ``costs``) the order of its rows in the batch, device ``d``
    taking positions ``[d G/D, (d+1) G/D)``: dearest first in a serpentine (ties by
    position), as the loader deals them (checked against ``step_balance``)."""
    rows = costs.shape[1]
    if devices <= 1 or rows <= devices:
        return np.broadcast_to(np.arange(rows), costs.shape)
    dearest = np.lexsort((np.broadcast_to(np.arange(rows), costs.shape), -costs), axis=1)
    turn, at = np.divmod(np.arange(rows), devices)
    slot = np.where(turn % 2 == 0, at, devices - 1 - at) * (rows // devices) + turn
    out = np.empty_like(dearest)
    np.put_along_axis(out, np.broadcast_to(slot, costs.shape), dearest, axis=1)
    return out


def _deal_seconds(packed: meshfeed.Packed, devices: int) -> float:
    """What the loader does each step of a balanced pack, over all steps: a step's costs
    read, its rows dealt."""
    step_rows = int(packed.step_rows)
    start = time.perf_counter()
    for first in range(0, len(packed), step_rows):
        deal(packed.row_costs(np.arange(first, first + step_rows))[None], devices)
    return time.perf_counter() - start


def run_peer(
    name: str, stream: np.ndarray, devices: int, per_device: int, seq_len: int, steps: int
) -> tuple[dict[str, np.ndarray], float]:
    """A peer's rule over the first ``steps`` steps of the stream of pieces, each step
    re-planned from a buffer of what it carried and the next pieces (at least ``G T``
    tokens for an ``"over"`` rule, else at most)."""
    rule, past = RULES[name], FILL[name] == "over"
    cum = np.concatenate([[0], np.cumsum(stream)])
    at, carry, seconds = 0, np.zeros(0, np.int64), 0.0
    figures: dict[str, list] = {k: [] for k in ("tokens", "over", "squares", "dearest", *COSTS)}
    for _ in range(steps):
        want = cum[at] + max(devices * per_device * seq_len - int(carry.sum()), 0)
        end = int(np.searchsorted(cum, want, "left" if past else "right")) - (0 if past else 1)
        end = min(max(at, end), len(stream))
        buffer = np.concatenate([carry, stream[at:end]])
        at = end
        if not len(buffer):
            break
        start = time.perf_counter()
        step = rule(buffer, devices, per_device, seq_len)
        seconds += time.perf_counter() - start
        placed = step.row >= 0
        carry = buffer[~placed]
        lengths, row = buffer[placed], step.row[placed]
        device = step.device[row]
        over = np.zeros(devices, bool)  # a row past what it holds, or more rows than r
        row_tokens = np.bincount(row, lengths, len(step.device))
        np.logical_or.at(over, step.device, row_tokens > step.capacity)
        over |= np.bincount(step.device, minlength=devices) * step.capacity > per_device * seq_len
        pairs = lengths * (lengths + 1) / 2  # a sequence's cost, as row_costs has it
        figures["over"].append(over)
        figures["tokens"].append(np.bincount(device, lengths, devices))
        figures["squares"].append(float((lengths.astype(np.float64) ** 2).sum()))
        figures["dearest"].append(float(pairs.max()) if len(pairs) else 0.0)
        for cost, token_cost in COSTS.items():
            figures[cost].append(np.bincount(device, pairs + token_cost * lengths, devices))
    return {k: np.array(v) for k, v in figures.items()}, seconds


def spearman(y: np.ndarray) -> float:
    """Spearman's rho of ``y`` against its index, 0 where there is none."""
    if len(y) < 3 or np.all(y == y[0]):
        return 0.0
    return float(stats.spearmanr(np.arange(len(y)), y).statistic)


def ratios(costs: np.ndarray) -> tuple[np.ndarray, float]:
    """Per step (a row) the slowest device's cost over the mean device's, and over the
    epoch the sum of the slowest over the sum of the mean."""
    mean, most = costs.mean(1), costs.max(1)
    per_step = np.where(mean > 0, most / np.where(mean > 0, mean, 1), 1.0)
    return per_step, float(most.sum() / mean.sum())


def summary(
    figures: dict[str, np.ndarray], devices: int, per_device: int, seq_len: int
) -> dict[str, Any]:
    """A rule's figures at one setting (cost "pairs": ``sum L(L+1)/2``; "token_cost": plus
    ``6 d`` a token); ``spearman``: a step's place against its tokens' mean segment length
    (``sum L^2 / sum L``); for a peer, ``imbalance_floor``: the least any split of its
    steps could reach, the dearest sequence of each step alone on a device."""
    steps, capacity = len(figures["tokens"]), per_device * seq_len
    pairs, time_ratio = ratios(figures["pairs"])
    token_cost, time_tc = ratios(figures["token_cost"])
    overflow = figures["over"] | (figures["tokens"] > capacity)
    tokens = figures["tokens"].sum(1)
    full = pairs[~figures["partial"]] if "partial" in figures else pairs
    line = {
        "steps": steps,
        "imbalance": round(float(pairs.mean()), 4),
        "imbalance_full_steps": round(float(full.mean()), 4) if len(full) else None,
        "imbalance_p99": round(float(np.percentile(pairs, 99)), 4),
        "imbalance_time": round(time_ratio, 4),
        "imbalance_token_cost": round(float(token_cost.mean()), 4),
        "imbalance_token_cost_time": round(time_tc, 4),
        "padding": round(1 - float(tokens.sum()) / (steps * devices * capacity), 5),
        "cap_violations": int(overflow.sum()),
        "cap_violation_fraction": round(float(overflow.mean()), 4),
        "most_tokens_on_a_device": round(float(figures["tokens"].max()) / capacity, 3),
        "spearman": round(spearman(figures["squares"] / np.maximum(tokens, 1)), 4),
        "spearman_noise95": round(1.96 / np.sqrt(max(steps - 1, 1)), 4),
    }
    if "dearest" in figures:
        floor = np.maximum(figures["dearest"] / figures["pairs"].mean(1), 1.0)
        line["imbalance_floor"] = round(float(floor.mean()), 4)
    return line


def meshfeed_lines(pack: Callable, plan_s: float, devices: int, per_device: int) -> list[dict]:
    """meshfeed's lines at one setting: the plan's rows with tokens in a seeded
    permutation (the loader's shuffle), and balanced, where ``plan_ms_per_step`` is
    ordering the plan's rows once plus dealing each step (best of 3)."""
    step_rows = devices * per_device
    packed, pack_s = pack(balance="pairs", token_cost=0.0, step_rows=step_rows)
    served = served_rows(packed)
    seq_len = packed.seq_len

    def rule_line(name: str, batches: np.ndarray, loads: Any = None) -> dict:
        """A rule's line from its steps' served rows (``loads``: ``step_balance``'s "pairs")."""
        tokens = served["tokens"][batches].reshape(len(batches), devices, -1)
        figures = {k: served[k][batches].reshape(tokens.shape).sum(-1) for k in ("tokens", *COSTS)}
        figures["over"] = (tokens > seq_len).any(-1)
        figures["squares"] = served["squares"][batches].sum(-1)
        figures["partial"] = (tokens == 0).any((1, 2))
        if loads is not None:
            figures["pairs"] = loads
        return {"rule": name, **summary(figures, devices, per_device, seq_len)}

    order = np.random.default_rng(SEED).permutation(np.flatnonzero(served["tokens"] > 0))
    order = np.concatenate([order, np.full((-len(order)) % step_rows, -1, np.int64)])
    shuffled = rule_line("meshfeed_random", order.reshape(-1, step_rows))
    shuffled["pack_ms_per_step"] = round(1e3 * plan_s / shuffled["steps"], 3)
    # the balanced steps as the loader deals them, then in a seeded permutation
    balance = step_balance(packed, devices)
    by_step = np.arange(len(packed)).reshape(-1, step_rows)
    batches = np.take_along_axis(by_step, deal(served["pairs"][by_step], devices), axis=1)
    loads = served["pairs"][batches].reshape(len(by_step), devices, -1).sum(-1)
    if not np.allclose(loads, balance.loads, rtol=1e-9):
        raise AssertionError("deal() does not deal the rows as step_balance does")
    steps = len(by_step)
    shuffle = np.random.default_rng(SEED).permutation(steps)
    batches, loads = batches[shuffle], balance.loads[shuffle]
    order_s = float(packed.stats()["balance_seconds"])
    deal_s = min(_deal_seconds(packed, devices) for _ in range(3))
    line = rule_line("meshfeed_balanced", batches, loads)
    line["plan_ms_per_step"] = round(1e3 * (order_s + deal_s) / steps, 4)
    line["balance_ms_per_step"] = round(1e3 * order_s / steps, 4)
    line["deal_ms_per_step"] = round(1e3 * deal_s / steps, 4)
    line["pack_ms_per_step"] = round(1e3 * plan_s / steps, 3)
    line["balanced_pack_ms_per_step"] = round(1e3 * pack_s / steps, 3)
    del packed
    with_cost, _ = pack(balance="pairs", token_cost=float(TOKEN_COST), step_rows=step_rows)
    per_step, time_ratio = ratios(step_balance(with_cost, devices).loads)
    line["imbalance_token_cost"] = round(float(per_step.mean()), 4)
    line["imbalance_token_cost_time"] = round(time_ratio, 4)
    return [shuffled, line]


def _print(**line: Any) -> None:
    print(json.dumps(line), flush=True)


def main() -> None:
    smoke = arguments(__doc__).smoke
    all_devices = [8, 64] if smoke else [8, 64, 512]
    steps, max_documents = (12, 10**5) if smoke else (200, 20 * 10**6)
    peer_pieces, peer_min_steps = (3_000, 4) if smoke else (300_000, 20)
    common = {"benchmark": "balance", "smoke": smoke, "python": platform.python_version()}
    for mix, seq_len in itertools.product(MIXES, (32768, 131072)):
        lengths = documents(mix, steps * max(all_devices) * seq_len)[:max_documents]
        pack = functools.partial(timed_pack, source(lengths), seq_len)
        plain, plan_s = pack()
        setting = {**common, "mix": mix, "seq_len": seq_len}
        _print(**setting, name="epoch", **epoch_line(lengths, seq_len, plain, plan_s))
        stream = pieces(lengths[np.random.default_rng(1).permutation(len(lengths))], seq_len)
        for devices, per_device in itertools.product(all_devices, (1, 4)):
            rows = devices * per_device
            if rows > max(all_devices):  # past the epoch's size
                continue
            at = {"devices": devices, "rows_per_device": per_device, "step_rows": rows}
            for line in meshfeed_lines(pack, plan_s, devices, per_device):
                _print(**setting, name="rule", **at, **line)
                if line["rule"] != "meshfeed_random":
                    judged = {"rule": line["rule"], "judged": devices == GOAL_DEVICES}
                    goals = {k: abs(line[k]) <= most for k, most in GOALS.items()}
                    _print(**setting, name="goals", **at, **judged, **goals)
            # the peers over the first steps of the stream (as many as peer_pieces pieces, at
            # least peer_min_steps: their steps are alike draws); plan_ms_per_step times our
            # Python version of the rule, so only indicative
            capacity = rows * seq_len
            wanted = int(peer_pieces * (stream.sum() / len(stream)) / capacity)
            peer_steps = min(int(stream.sum()) // capacity - 2, max(peer_min_steps, wanted))
            for name in RULES:
                figures, seconds = run_peer(name, stream, devices, per_device, seq_len, peer_steps)
                line = {"rule": name, **summary(figures, devices, per_device, seq_len)}
                line["plan_ms_per_step"] = round(1e3 * seconds / line["steps"], 3)
                _print(**setting, name="rule", **at, **line)


if __name__ == "__main__":
    main()
