import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_examples_run():
    """The README's Python blocks, in order, in one namespace (sketches excepted)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    namespace: dict = {}
    ran = 0
    for block in blocks:
        if block.startswith("# sketch"):
            continue
        exec(compile(block, str(README), "exec"), namespace)
        ran += 1
    assert ran >= 3
    assert namespace["history"].steps == len(namespace["loader"])
    assert namespace["state"].params["w1"].sharding.spec == namespace["P"](None, "model")


def test_readme_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    head = "\n".join(lines[:6])
    assert "python3 -m meshfeed demo" in head
    assert "python3 -m pytest" in head
