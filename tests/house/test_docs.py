"""The README and the documentation hold: their code runs, the reference matches the code.

Every Python block of the README and of each page under ``docs/`` runs as written, in
order, in a fresh process with one CPU device (a block starting ``# sketch`` is left
out: it names a server or a file the reader has and the tests do not); a block that
does not start with ``# continues`` also runs alone, in a namespace of its own (the
page's such blocks one after another in a second process). The API reference lists exactly
each public module's ``__all__``. The site itself is built with warnings as errors by
``.ci/run``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
CONTINUES = "# continues "
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
PAGES = [p for p in PAGES if "generated" not in p.parts]
REFERENCE = {  # module -> its API page
    "meshfeed": DOCS / "api" / "index.md",
    "meshfeed.keras": DOCS / "api" / "keras.md",
    "meshfeed.flax": DOCS / "api" / "flax.md",
    "meshfeed.ops": DOCS / "api" / "ops.md",
    "meshfeed.testing": DOCS / "api" / "testing.md",
    **{
        f"meshfeed.{m}": DOCS / "api" / f"{m}.md"
        for m in ("sources", "schedules", "inspect", "train", "types", "vision")
    },
}

RUN = """
import json, sys
namespace, seen, alone = {}, [], sys.argv[3] == "alone"
for block in json.loads(sys.argv[1]):
    if alone:
        namespace = {}
    exec(compile(block, sys.argv[2], "exec"), namespace)
    history, loader = namespace.get("history"), namespace.get("loader")
    params = getattr(namespace.get("state"), "params", {})
    kernel = getattr(getattr(namespace.get("model"), "hidden", None), "kernel", None)
    seen.append({
        "steps": getattr(history, "steps", None),
        "len": len(loader) if loader is not None and loader.num_epochs else None,
        "spec": list(params["w1"].sharding.spec) if "w1" in params else None,
        "model_spec": list(kernel.get_value().sharding.spec) if kernel is not None else None,
    })
print(json.dumps(seen))
"""


def _blocks(page: Path) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    return [b for b in blocks if not b.startswith("# sketch")]


def _run(page: Path, blocks: list[str], *, alone: bool = False) -> list[dict]:
    """The blocks in one namespace (``alone``: each in its own), in a fresh process with
    one CPU device; what each left."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    how = "alone" if alone else "together"
    run = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(blocks), str(page.relative_to(ROOT)), how],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "JAX_PLATFORMS": "cpu", "KERAS_BACKEND": "jax"},
        cwd=ROOT,
    )
    assert run.returncode == 0, f"{page.relative_to(ROOT)}:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


RUNNABLE = [p for p in PAGES if _blocks(p)]


@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_the_python_blocks_run_in_order_on_one_cpu_device(page):
    blocks = _blocks(page)
    seen = dict(zip(blocks, _run(page, blocks), strict=True))
    # A block after the first that does not say what it continues must stand alone.
    alone = [b for b in blocks[1:] if not b.startswith(CONTINUES)]
    if alone:
        _run(page, alone, alone=True)
    if page.name == "training.md":

        def after(text: str) -> dict:
            (block,) = [b for b in blocks if text in b]
            return seen[block]

        fit = after("meshfeed.fit(step, state, loader, eval_loader=None")
        assert fit["steps"] == fit["len"]  # one whole epoch
        assert after('TrainState.create({"w1": kernel}')["spec"] == [None, "model"]
        nnx = after("meshfeed.flax.update_model(model")
        assert nnx["steps"] == 20 and nnx["model_spec"] == [None, "model"]


def test_the_readme_is_the_door():
    lines = README.read_text().splitlines()
    head = "\n".join(lines[:6])
    assert "python3 -m meshfeed demo" in head
    assert "python3 -m pytest" in head
    assert len(lines) <= 200
    assert "sphinx -W" in README.read_text()  # how to build the site


def test_each_guide_opens_with_the_code_that_does_its_task():
    for page in sorted((DOCS / "guides").glob("*.md")):
        lines = [line for line in page.read_text().splitlines() if line.strip()]
        assert lines[0].startswith("# "), page.name
        assert lines[1].startswith("```"), f"{page.name} opens with prose, not code"


def _documented(page: Path) -> list[str]:
    names = []
    pattern = r"\.\. autosummary::\n(.*?)```"
    for block in re.findall(pattern, page.read_text(), flags=re.S):
        names += [line.strip() for line in block.splitlines() if line.strip()[:1] not in ":"]
    return names


@pytest.mark.parametrize("module", sorted(REFERENCE))
def test_the_reference_lists_every_public_name_once(module):
    public = set(importlib.import_module(module).__all__)
    documented = _documented(REFERENCE[module])
    assert len(documented) == len(set(documented)), "a name is listed twice"
    if module == "meshfeed":  # the public modules have their own pages
        public -= {"ops", "sources", "schedules", "inspect", "train", "types", "vision"}
    assert sorted(documented) == sorted(public)
