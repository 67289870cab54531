"""Balanced steps: how evenly each rule spreads a step's attention cost over the devices.

On document lengths alone: three mixes (``MIXES``), rows of ``T`` = 32k and 128k tokens,
``D`` = 8, 64 and 512 data-parallel devices with ``r`` = 1 or 4 rows each (``G = D r``
rows a step, up to 512). meshfeed's ``pack(balance="pairs", step_rows=G)`` dealt as the
loader deals it (``inspect.step_balance``) and meshfeed without ``balance`` against the
rules of tunix, TRL, torchtitan and slime (``balance_rules``), each re-planning every
step from a buffer of the epoch's pieces in a random order. The figures of a rule are
``summary``'s; goals: ``GOALS`` at ``D = 64``. ``--smoke`` for CI.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable

import numpy as np
from balance_rules import FILL, RULES
from harness import arguments

import meshfeed
from meshfeed.inspect import step_balance

LOW, HIGH = 137, 131_072
TOKEN_COST = 6 * 4096
"""The second cost figure's share per token: ``6 d`` pairs for width ``d = 4096``."""
COSTS = {"pairs": 0.0, "token_cost": float(TOKEN_COST)}
GOALS = {"imbalance": 1.03, "padding": 0.005, "plan_ms_per_step": 1.0, "spearman": 0.05}
GOAL_DEVICES = 64
ALGORITHM = "best_fit_decreasing"
EMPTY = -1
"""A served row that is empty (all padding), as the benchmark marks it."""
SEED = 0
"""The seed of the numpy permutations that stand in for the loader's keyed shuffles."""
SMOKE = {
    "devices": [8, 64],
    "steps": 12,
    "max_documents": 10**5,
    "peer_pieces": 3_000,
    "peer_min_steps": 4,
}
FULL = {
    "devices": [8, 64, 512],
    "steps": 200,
    "max_documents": 20 * 10**6,
    "peer_pieces": 300_000,
    "peer_min_steps": 20,
}
"""The flags' values left unset, under ``--smoke`` and not."""


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
        part = MIXES[mix](rng, 1 << 20).astype(np.int64)
        parts.append(part)
        total += int(part.sum())
    lengths = np.concatenate(parts)
    return lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]


def pieces(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """Each document cut into ``seq_len`` pieces, in order (``long_docs="split"``)."""
    count = -(-lengths // seq_len)
    first = np.repeat(np.cumsum(count) - count, count)
    at = np.arange(int(count.sum())) - first
    return np.minimum(np.repeat(lengths, count) - at * seq_len, seq_len)


def source_of(lengths: np.ndarray) -> meshfeed.ArraySource:
    """The documents as a source: ragged tokens of these lengths, the values a zero-byte
    view (a plan reads the lengths only)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.broadcast_to(np.zeros(1, np.uint8), (int(offsets[-1]),))
    return meshfeed.ArraySource({"tokens": meshfeed.Ragged(values, offsets)})


class Epoch:
    """One epoch's documents: their source, and its plan without ``balance`` (its rows,
    padding and planning time)."""

    def __init__(self, lengths: np.ndarray, seq_len: int, window: int | None) -> None:
        self.lengths, self.seq_len, self.window = lengths, seq_len, window
        self.source = source_of(lengths)
        plain, self.plan_s = self.pack()
        self.rows, self.plan_stats, self.plan = len(plain), plain.stats(), plain.plan
        self.piece_lengths = pieces(lengths, seq_len)  # the plan's pieces ("split")
        self.tokens = int(lengths.sum())
        self.mean_piece = self.tokens / len(self.piece_lengths)

    def pack(self, **balance: object) -> tuple[meshfeed.Packed, float]:
        """``meshfeed.pack`` of the epoch (``balance`` its balance arguments), and its time."""
        start = time.perf_counter()
        packed = meshfeed.pack(
            self.source,
            self.seq_len,
            algorithm=ALGORITHM,
            window=self.window,
            long_docs="split",
            plan_dir=False,
            **balance,
        )
        return packed, time.perf_counter() - start

    def balanced(self, step_rows: int, token_cost: float) -> tuple[meshfeed.Packed, float]:
        """The epoch packed with ``balance="pairs"`` in steps of ``step_rows``."""
        return self.pack(balance="pairs", token_cost=token_cost, step_rows=step_rows)

    def stats(self) -> dict:
        """The epoch's line: its documents, pieces, rows, padding and planning time."""
        return {
            "algorithm": ALGORITHM,
            "window": self.window,
            "documents": len(self.lengths),
            "pieces": len(self.piece_lengths),
            "rows": self.rows,
            "mean_document": round(float(self.lengths.mean()), 1),
            "mean_piece": round(self.mean_piece, 1),
            "plan_padding": round(float(self.plan_stats["padding_fraction"]), 5),
            "padding_floor": round(self.padding_floor(), 5),
            "plan_s": round(self.plan_s, 2),
        }

    def padding_floor(self) -> float:
        """The least padding any packing of these pieces has: rows for the tokens, and
        at least one for each piece over ``T / 2`` (no two share a row)."""
        halves = int((2 * self.piece_lengths > self.seq_len).sum())
        rows = max(-(-self.tokens // self.seq_len), halves)
        return 1 - self.tokens / (rows * self.seq_len)


class Served:
    """A balanced pack's served rows: per row its costs, tokens and ``sum L^2`` (from
    ``row_costs`` and ``row_tokens``: ``sum L(L+1)/2 = (sum L^2 + sum L) / 2``)."""

    def __init__(self, packed: meshfeed.Packed) -> None:
        ids = np.arange(len(packed))
        pairs = packed.row_costs(ids)
        self.tokens = packed.row_tokens(ids)
        self.costs = {name: pairs + token_cost * self.tokens for name, token_cost in COSTS.items()}
        self.squares = 2 * pairs - self.tokens
        self.seq_len = packed.seq_len


def steps_of(order: np.ndarray, step_rows: int) -> np.ndarray:
    """Served rows (``EMPTY`` for an empty one) cut into steps, the last made whole."""
    pad = (-len(order)) % step_rows
    return np.concatenate([order, np.full(pad, EMPTY, np.int64)]).reshape(-1, step_rows)


def of_rows(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values`` of served rows, 0 for an empty row."""
    return np.where(rows >= 0, values[np.maximum(rows, 0)], 0)


def meshfeed_random(served: Served, step_rows: int) -> np.ndarray:
    """The plan's rows (those served rows that hold tokens) in a seeded permutation --
    standing in for the loader's keyed shuffle of the rows -- ``G`` a step; a step's
    rows to the devices in order."""
    real = np.flatnonzero(served.tokens > 0)
    return steps_of(np.random.default_rng(SEED).permutation(real), step_rows)


def deal(costs: np.ndarray, devices: int) -> np.ndarray:
    """Per step (a row of ``costs``) the order of its rows in the batch, device ``d``
    taking positions ``[d G/D, (d+1) G/D)``: dealt dearest first in a serpentine (ties by
    position), as the loader deals them. Only for each device's tokens, which
    ``step_balance`` does not give; its costs are checked against ``step_balance``'s."""
    rows = costs.shape[1]
    if devices <= 1 or rows <= devices:
        return np.broadcast_to(np.arange(rows), costs.shape)
    per = rows // devices
    dearest = np.lexsort((np.broadcast_to(np.arange(rows), costs.shape), -costs), axis=1)
    turn, at = np.divmod(np.arange(rows), devices)
    slot = np.where(turn % 2 == 0, at, devices - 1 - at) * per + turn  # per dealt row
    out = np.empty_like(dearest)
    np.put_along_axis(out, np.broadcast_to(slot, costs.shape), dearest, axis=1)
    return out


def _deal_seconds(packed: meshfeed.Packed, devices: int) -> float:
    """The time of what the loader does each step of a balanced pack, over all steps: a
    step's ``G`` costs read, its rows dealt to the devices (``deal``, as the loader
    deals them)."""
    step_rows = int(packed.step_rows)
    start = time.perf_counter()
    for first in range(0, len(packed), step_rows):
        deal(packed.row_costs(np.arange(first, first + step_rows))[None], devices)
    return time.perf_counter() - start


def meshfeed_balanced(
    packed: meshfeed.Packed, served: Served, devices: int
) -> tuple[np.ndarray, np.ndarray]:
    """The balanced pack's steps as the loader deals them (``step_balance``), then in a
    seeded permutation of the steps (standing in for the loader's shuffle): the served
    rows of each step in batch order, and each device's "pairs" cost."""
    balance = step_balance(packed, devices)
    step_rows = int(packed.step_rows)
    steps = np.arange(len(packed)).reshape(-1, step_rows)
    batches = np.take_along_axis(steps, deal(served.costs["pairs"][steps], devices), axis=1)
    loads = served.costs["pairs"][batches].reshape(len(steps), devices, -1).sum(-1)
    if not np.allclose(loads, balance.loads, rtol=1e-9):
        raise AssertionError("deal() does not deal the rows as step_balance does")
    shuffle = np.random.default_rng(SEED).permutation(len(steps))
    return batches[shuffle], balance.loads[shuffle]


def meshfeed_figures(served: Served, batches: np.ndarray, devices: int) -> dict[str, np.ndarray]:
    """Per step and device: tokens, costs and whether its rows cannot hold its tokens;
    per step: ``sum L^2`` and whether it holds an empty row."""
    shape = (len(batches), devices, -1)
    tokens = of_rows(served.tokens, batches).reshape(shape)
    out = {
        "tokens": tokens.sum(-1),
        "over": (tokens > served.seq_len).any(-1),
        "squares": of_rows(served.squares, batches).sum(-1),
        "partial": (of_rows(served.tokens, batches) == 0).any(-1),
    }
    for name in COSTS:
        out[name] = of_rows(served.costs[name], batches).reshape(shape).sum(-1)
    return out


def run_peer(
    name: str, stream: np.ndarray, devices: int, per_device: int, seq_len: int, steps: int
) -> tuple[dict[str, np.ndarray], float]:
    """A peer's rule over the first ``steps`` steps of the stream of pieces (see module)."""
    rule, past = RULES[name], FILL[name] == "over"  # the buffer at least G T (else at most)
    capacity = devices * per_device * seq_len
    cum = np.concatenate([[0], np.cumsum(stream)])
    at, carry, seconds = 0, np.zeros(0, np.int64), 0.0
    figures: dict[str, list] = {
        k: [] for k in ("tokens", "over", "squares", "partial", "dearest", *COSTS)
    }
    for _ in range(steps):
        want = cum[at] + max(capacity - int(carry.sum()), 0)
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
        figures["over"].append(over)
        figures["tokens"].append(np.bincount(device, lengths, devices))
        figures["squares"].append(float((lengths.astype(np.float64) ** 2).sum()))
        figures["partial"].append(False)
        dearest = float(lengths.max()) if len(lengths) else 0.0
        figures["dearest"].append(dearest * (dearest + 1) / 2)
        pairs = lengths * (lengths + 1) / 2  # a sequence's cost, as row_costs has it
        for name, token_cost in COSTS.items():
            figures[name].append(np.bincount(device, pairs + token_cost * lengths, devices))
    return {k: np.array(v) for k, v in figures.items()}, seconds


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their mean rank."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.diff(sorted_x, prepend=np.nan) != 0)
    ends = np.append(starts[1:], len(x))
    mean_rank = (starts + ends + 1) / 2
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def spearman(y: np.ndarray) -> float:
    """Spearman's rho of ``y`` against its index."""
    if len(y) < 3 or np.all(y == y[0]):
        return 0.0
    a, b = rankdata(np.arange(len(y), dtype=np.float64)), rankdata(y)
    return float(np.corrcoef(a, b)[0, 1])


def per_step(costs: np.ndarray) -> np.ndarray:
    """Each step's slowest device's cost over the mean device's."""
    mean, most = costs.mean(1), costs.max(1)
    return np.where(mean > 0, most / np.where(mean > 0, mean, 1), 1.0)


def ratios(costs: np.ndarray) -> tuple[float, float, float]:
    """Per step max / mean device cost: their mean, their 99th percentile, and the
    epoch's sum of max over sum of mean."""
    steps = per_step(costs)
    time_ratio = float(costs.max(1).sum() / costs.mean(1).sum())
    return float(steps.mean()), float(np.percentile(steps, 99)), time_ratio


def summary(
    figures: dict[str, np.ndarray], devices: int, per_device: int, seq_len: int
) -> dict[str, float | int]:
    """A rule's figures at one setting. ``imbalance``: the mean over steps of the slowest
    device's cost over the mean device's, cost "pairs" (``sum L(L+1)/2``);
    ``_full_steps``: over the steps with no empty row; ``imbalance_time``: ``sum max / sum
    mean`` over the epoch; ``imbalance_token_cost``: with ``6 d`` a token added;
    ``padding``: empty slots over all; ``cap_violations``: (step, device) pairs whose rows
    cannot hold the device's tokens; ``spearman``: Spearman's rho of a step's place
    against its tokens' mean segment length (``sum L^2 / sum L``), beside
    ``spearman_noise95``, the band a random order stays in 95% of the time; for a peer,
    ``imbalance_floor``: the least any split of its steps could reach."""
    steps, capacity = len(figures["tokens"]), per_device * seq_len
    imbalance, p99, time_ratio = ratios(figures["pairs"])
    imbalance_tc, _, time_tc = ratios(figures["token_cost"])
    overflow = figures["over"] | (figures["tokens"] > per_device * seq_len)
    tokens = figures["tokens"].sum(1)
    mean_length = figures["squares"] / np.maximum(tokens, 1)  # sum L^2 / sum L
    full = per_step(figures["pairs"])[~figures["partial"]]
    return {
        "steps": steps,
        "imbalance": round(imbalance, 4),
        "imbalance_full_steps": round(float(full.mean()), 4) if len(full) else None,
        "imbalance_p99": round(p99, 4),
        "imbalance_time": round(time_ratio, 4),
        "imbalance_token_cost": round(imbalance_tc, 4),
        "imbalance_token_cost_time": round(time_tc, 4),
        "padding": round(1 - float(tokens.sum()) / (steps * devices * per_device * seq_len), 5),
        "cap_violations": int(overflow.sum()),
        "cap_violation_fraction": round(float(overflow.mean()), 4),
        "most_tokens_on_a_device": round(float(figures["tokens"].max()) / capacity, 3),
        "spearman": round(spearman(mean_length), 4),
        "spearman_noise95": round(1.96 / np.sqrt(max(steps - 1, 1)), 4),
    } | _floor(figures)


def _floor(figures: dict[str, np.ndarray]) -> dict[str, float]:
    """For a peer: the least imbalance any split of its steps' sequences over the devices
    could have ("pairs"), the dearest sequence of each step alone on a device."""
    if "dearest" not in figures:
        return {}
    floor = np.maximum(figures["dearest"] / figures["pairs"].mean(1), 1.0)
    return {"imbalance_floor": round(float(floor.mean()), 4)}


def goals(line: dict) -> dict[str, bool]:
    """Which of meshfeed's goals a line meets."""
    return {
        "imbalance": line["imbalance"] <= GOALS["imbalance"],
        "padding": line["padding"] <= GOALS["padding"],
        "plan_ms_per_step": line["plan_ms_per_step"] <= GOALS["plan_ms_per_step"],
        "cap_violations": line["cap_violations"] == 0,
        "spearman": abs(line["spearman"]) <= GOALS["spearman"],
    }


def measure(args: argparse.Namespace) -> None:
    common = {"benchmark": "balance", "smoke": args.smoke, "python": platform.python_version()}
    for mix in args.mixes:
        for seq_len in args.seq_lens:
            tokens = args.steps * max(args.devices) * seq_len
            lengths = documents(mix, tokens)[: args.max_documents]
            epoch = Epoch(lengths, seq_len, args.window)
            setting = {**common, "mix": mix, "seq_len": seq_len}
            print(json.dumps({**setting, "name": "epoch", **epoch.stats()}), flush=True)
            rng = np.random.default_rng(1)
            stream = pieces(lengths[rng.permutation(len(lengths))], seq_len)
            for devices in args.devices:
                for per_device in args.rows_per_device:
                    if devices * per_device > max(args.devices):  # past the epoch's size
                        continue
                    at = {
                        **setting,
                        "name": "rule",
                        "devices": devices,
                        "rows_per_device": per_device,
                        "step_rows": devices * per_device,
                    }
                    for line in meshfeed_lines(epoch, devices, per_device):
                        print(json.dumps({**at, **line}), flush=True)
                        if line["rule"] != "meshfeed_random":
                            judged = {"judged": devices == GOAL_DEVICES, **goals(line)}
                            print(
                                json.dumps({**at, "name": "goals", "rule": line["rule"], **judged})
                            )
                    for line in peer_lines(args, epoch, stream, devices, per_device):
                        print(json.dumps({**at, **line}), flush=True)


def meshfeed_lines(epoch: Epoch, devices: int, per_device: int) -> list[dict]:
    """The lines of meshfeed's rules (today's, balanced) at one setting. Balanced:
    ``plan_ms_per_step`` is ordering the plan's rows once (``balance_ms_per_step``, the
    pack's ``balance_seconds``) plus what the loader does each step (``deal_ms_per_step``,
    best of 3); ``pack_ms_per_step`` the plan itself (``pack`` without ``balance``),
    ``balanced_pack_ms_per_step`` ``pack`` with it; its token-cost figures from a pack
    with ``token_cost=6 d``."""
    step_rows = devices * per_device
    packed, pack_s = epoch.balanced(step_rows, 0.0)
    served = Served(packed)
    batches = meshfeed_random(served, step_rows)
    line = _meshfeed_line("meshfeed_random", served, devices, batches)
    line["pack_ms_per_step"] = round(1e3 * epoch.plan_s / len(batches), 3)
    lines = [line]

    batches, loads = meshfeed_balanced(packed, served, devices)
    steps = len(batches)
    order_s = float(packed.stats()["balance_seconds"])
    deal_s = min(_deal_seconds(packed, devices) for _ in range(3))
    line = _meshfeed_line("meshfeed_balanced", served, devices, batches, loads)
    line["plan_ms_per_step"] = round(1e3 * (order_s + deal_s) / steps, 4)
    line["balance_ms_per_step"] = round(1e3 * order_s / steps, 4)
    line["deal_ms_per_step"] = round(1e3 * deal_s / steps, 4)
    line["pack_ms_per_step"] = round(1e3 * epoch.plan_s / steps, 3)
    line["balanced_pack_ms_per_step"] = round(1e3 * pack_s / steps, 3)
    del packed, served
    with_cost, _ = epoch.balanced(step_rows, float(TOKEN_COST))
    mean, _, time_ratio = ratios(step_balance(with_cost, devices).loads)
    line["imbalance_token_cost"] = round(mean, 4)
    line["imbalance_token_cost_time"] = round(time_ratio, 4)
    return [*lines, line]


def _meshfeed_line(
    name: str, served: Served, devices: int, batches: np.ndarray, loads: np.ndarray | None = None
) -> dict:
    figures = meshfeed_figures(served, batches, devices)
    if loads is not None:  # step_balance's costs ("pairs") of the same steps
        figures["pairs"] = loads
    per_device = batches.shape[1] // devices
    return {"rule": name, **summary(figures, devices, per_device, served.seq_len)}


def peer_lines(
    args: argparse.Namespace, epoch: Epoch, stream: np.ndarray, devices: int, per_device: int
) -> list[dict]:
    """The peers' lines at one setting, each over the first steps of ``stream`` (as many
    as ``--peer-pieces`` sequences, at least ``--peer-min-steps``: their steps are alike
    draws, so a prefix measures them); ``plan_ms_per_step`` is our Python version of the
    rule, so only indicative."""
    rows, seq_len = devices * per_device, epoch.seq_len
    wanted = int(args.peer_pieces * epoch.mean_piece / (rows * seq_len))
    steps = min(int(stream.sum()) // (rows * seq_len) - 2, max(args.peer_min_steps, wanted))
    lines = []
    for name in args.rules:
        figures, seconds = run_peer(name, stream, devices, per_device, seq_len, steps)
        line = {"rule": name, **summary(figures, devices, per_device, seq_len)}
        line["plan_ms_per_step"] = round(1e3 * seconds / line["steps"], 3)
        lines.append(line)
    return lines


def main() -> None:
    args = arguments(__doc__, add=_flags)
    for key, value in (SMOKE if args.smoke else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    measure(args)


def _flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[32768, 131072])
    parser.add_argument("--devices", nargs="+", type=int, default=None)
    parser.add_argument(
        "--rows-per-device",
        nargs="+",
        type=int,
        default=[1, 4],
        help="r; a (D, r) with D r past the largest D is left out",
    )
    parser.add_argument("--rules", nargs="*", default=list(RULES), choices=list(RULES))
    parser.add_argument("--steps", type=int, help="steps of the largest D in an epoch")
    parser.add_argument("--max-documents", type=int, help="documents an epoch holds at most")
    parser.add_argument("--peer-pieces", type=int, help="sequences given to a peer's rule")
    parser.add_argument("--peer-min-steps", type=int, help="steps a peer's rule runs at least")
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        help="documents planned together (default: pack's for the algorithm)",
    )


if __name__ == "__main__":
    main()
