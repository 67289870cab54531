"""The harness every benchmark runs in: devices, flags, rounds, medians, JSON lines.

Example::

    def main() -> None:
        use_cpu_devices()
        args = arguments(__doc__, seconds=2.0, rounds=7)
        per_round = in_rounds({"floor": floor, "meshfeed": ours}, args.rounds)
        emit("mine", smoke=args.smoke, name="meshfeed",
             ratio_to_floor=median_ratio(per_round, "meshfeed", "floor"))
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import version
from typing import Any, TextIO, TypeVar

Figure = TypeVar("Figure")

_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def use_cpu_devices(count: int = 8) -> None:
    """``count`` CPU devices for this process and its children, unless set already.

    Call it before the first device is used: JAX reads ``XLA_FLAGS`` when its backend
    starts, not when it is imported."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _DEVICE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_DEVICE_FLAG}={count}".strip()
    if "JAX_PLATFORMS" not in os.environ:
        os.environ["JAX_PLATFORMS"] = "cpu"
        if "jax" in sys.modules:  # imported already: its config read the variable then
            sys.modules["jax"].config.update("jax_platforms", "cpu")


def arguments(
    doc: str | None,
    *,
    seconds: float | None = None,
    rounds: int | None = None,
    smoke: Mapping[str, Any] | None = None,
    add: Callable[[argparse.ArgumentParser], object] | None = None,
    argv: Sequence[str] | None = None,
) -> argparse.Namespace:
    """The benchmark's flags parsed, with ``smoke``'s values applied under ``--smoke``
    (by default ``seconds=0.3, rounds=1``, for the flags there are)."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data and timings, for CI")
    if seconds is not None:
        parser.add_argument("--seconds", type=float, default=seconds, help="per entry per round")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help="rounds; the median")
    if add is not None:
        add(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        if smoke is None:
            smoke = {k: v for k, v in (("seconds", 0.3), ("rounds", 1)) if hasattr(args, k)}
        for name, value in smoke.items():
            setattr(args, name, value)
    return args


def in_rounds(
    entries: Mapping[str, Callable[[], Figure] | str], rounds: int, pause: float = 0.3
) -> list[dict[str, Figure]]:
    """Every entry once a round, the order rotating by round; strings are not run."""
    runs = {name: entry for name, entry in entries.items() if not isinstance(entry, str)}
    names = list(runs)
    per_round: list[dict[str, Figure]] = []
    for r in range(rounds):
        got: dict[str, Figure] = {}
        shift = r % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            got[name] = runs[name]()
            gc.collect()
            time.sleep(pause)  # let the entry's workers go before the next one starts
        per_round.append(got)
    return per_round


def _value(figure: Any, key: str | None) -> float:
    return figure if key is None else figure[key]


def median_of(
    per_round: Sequence[Mapping[str, Any]], name: str, key: str | None = None
) -> float | None:
    """The median over rounds of ``name``'s figure (its ``key`` for dict figures)."""
    values = [_value(r[name], key) for r in per_round if name in r]
    return statistics.median(values) if values else None


def median_ratio(
    per_round: Sequence[Mapping[str, Any]],
    a: str,
    b: str,
    key: str | None = None,
    digits: int = 3,
) -> float | None:
    """The median over rounds of ``a / b`` taken within each round, rounded."""
    ratios = [_value(r[a], key) / _value(r[b], key) for r in per_round if a in r and b in r]
    return round(statistics.median(ratios), digits) if ratios else None


def make_line(benchmark: str, *, smoke: bool, **fields: Any) -> dict[str, Any]:
    """A JSON line's fields: ``benchmark``, ``fields``, then what every line carries;
    ``devices`` and ``processes`` from this process's JAX unless ``fields`` has them."""
    line = {"benchmark": benchmark, **fields}
    if "devices" not in line or "processes" not in line:
        import jax

        line.setdefault("devices", jax.device_count())
        line.setdefault("processes", jax.process_count())
    line.setdefault("smoke", smoke)
    line.setdefault("jax", version("jax"))
    line.setdefault("python", platform.python_version())
    return line


def emit(
    benchmark: str, *, smoke: bool, stream: TextIO | None = None, **fields: Any
) -> dict[str, Any]:
    """Prints ``make_line(benchmark, smoke=smoke, **fields)`` as one JSON line."""
    line = make_line(benchmark, smoke=smoke, **fields)
    print(json.dumps(line), file=stream or sys.stdout, flush=True)
    return line


def run_child(
    args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float | None = None
) -> Any:
    """``python args...`` in a fresh process (killed after ``timeout`` seconds); its last
    line of stdout, as JSON."""
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=None if env is None else dict(env),
        timeout=timeout,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise RuntimeError(
            f"{' '.join(args)} failed (exit code {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return json.loads(lines[-1])
