"""The strategies guide's table names the call each strategy builds its arrays with: hold it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import Sharding

import meshfeed

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "strategies.md"
BUILDERS = (
    "make_array_from_callback",
    "make_array_from_single_device_arrays",
    "make_array_from_process_local_data",
)


def _table() -> dict[str, str]:
    """strategy -> the ``jax.`` call its row names first."""
    section = GUIDE.read_text().split("## The four strategies", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        strategy = re.match(r"`(\w+)`", cells[0])
        call = re.search(r"`jax\.(\w+)`", cells[2])
        if strategy and call:
            rows[strategy.group(1)] = call.group(1)
    return rows


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The JAX array builders called, in order; each still does its work."""
    seen: list[str] = []
    for name in BUILDERS:
        real = getattr(jax, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            seen.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(jax, name, spy)
    real_put = jax.device_put

    def put(x: Any, device: Any = None, **kwargs: Any) -> Any:
        if isinstance(device, Sharding) and not isinstance(x, jax.Array):
            seen.append("device_put of host data to a sharding")
        return real_put(x, device, **kwargs)

    monkeypatch.setattr(jax, "device_put", put)
    return seen


def test_the_table_names_a_call_for_every_concrete_strategy():
    assert sorted(_table()) == sorted(s for s in meshfeed.inspect.STRATEGIES if s != "auto")
    assert set(_table().values()) <= set(BUILDERS)


@pytest.mark.parametrize("strategy", meshfeed.inspect.STRATEGIES)
def test_each_strategy_builds_with_the_call_the_readme_names(strategy, calls):
    mesh = meshfeed.make_mesh(data=4, model=2)
    loader = meshfeed.Loader(
        meshfeed.ArraySource({"x": np.zeros((64, 4), np.float32), "y": np.arange(64)}),
        global_batch_size=16,
        sharding=meshfeed.batch_sharding(mesh),
        strategy=strategy,
        prefetch=0,
    )
    batch = next(iter(loader))
    jax.block_until_ready(batch)
    named = _table()[loader.strategy]
    assert calls == [named] * len(batch), calls
