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
namespace, seen = {}, []
for block in json.loads(sys.argv[1]):
    exec(compile(block, "README.md", "exec"), namespace)
    history, loader = namespace.get("history"), namespace.get("loader")
    params = getattr(namespace.get("state"), "params", {})
    kernel = getattr(getattr(namespace.get("model"), "hidden", None), "kernel", None)
    seen.append({
        "steps": getattr(history, "steps", None),
        "len": len(loader) if loader is not None else None,
        "spec": list(params["w1"].sharding.spec) if "w1" in params else None,
        "model_spec": list(kernel.get_value().sharding.spec) if kernel is not None else None,
    })
print(json.dumps(seen))
"""


def _blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if not b.startswith("# sketch")]


def _run(blocks: list[str]) -> list[dict]:
    """The blocks in one namespace, in a fresh process with one CPU device; what each left."""
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
    seen = dict(zip(blocks, _run(blocks), strict=True))

    def after(text: str) -> dict:
        (block,) = [b for b in blocks if text in b]
        return seen[block]

    fit = after("meshfeed.fit(step, state, loader, eval_loader=None")
    assert fit["steps"] == fit["len"]  # one whole epoch
    assert after('TrainState.create({"w1": kernel}')["spec"] == [None, "model"]
    nnx = after("meshfeed.flax.update_model(model")
    assert nnx["steps"] == 20 and nnx["model_spec"] == [None, "model"]


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
