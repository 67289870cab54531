"""The README's Python blocks run as written, on a machine with one CPU device."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
CONTINUES = "# continues "

RUN = """
import json, sys
namespace = {}
for block in json.loads(sys.argv[1]):
    exec(compile(block, "README.md", "exec"), namespace)
history, loader = namespace.get("history"), namespace.get("loader")
params = getattr(namespace.get("state"), "params", {})
print(json.dumps({
    "steps": getattr(history, "steps", None),
    "len": len(loader) if loader is not None else None,
    "spec": list(params["w1"].sharding.spec) if "w1" in params else None,
}))
"""


def _blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if not b.startswith("# sketch")]


def _run(blocks: list[str]) -> dict:
    """The blocks in one namespace, in a fresh process with one CPU device."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(blocks)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "JAX_PLATFORMS": "cpu"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_readme_python_blocks_run_in_order_on_one_cpu_device():
    """Every block but the sketches, in order, in one namespace, as a reader runs them."""
    blocks = _blocks()
    assert len(blocks) >= 4
    got = _run(blocks)
    assert got["steps"] == got["len"]
    assert got["spec"] == [None, "model"]


def test_each_readme_block_runs_alone_or_says_what_it_continues():
    """A block that does not start with '# continues ...' runs in a fresh process alone."""
    alone = [b for b in _blocks() if not b.startswith(CONTINUES)]
    assert len(alone) >= 2
    for block in alone:
        _run([block])


def test_readme_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    head = "\n".join(lines[:6])
    assert "python3 -m meshfeed demo" in head
    assert "python3 -m pytest" in head
