"""README's module map is the import order, and the layers hold (read from the source)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "meshfeed"
DATA_LAYER_TOP = "_loader"
RENDERERS = ("rich", "matplotlib")


def _module_map() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Module map", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, flags=re.S)
    assert block is not None
    return [line.split()[0] for line in block.group(1).splitlines() if line.strip()]


def _modules() -> dict[str, Path]:
    """Module name in the map (a package counts as one) -> its files' folder or file."""
    out = {}
    for path in PACKAGE.iterdir():
        if path.name in ("__init__.py", "__main__.py", "__pycache__"):
            continue
        out[path.stem if path.suffix == ".py" else path.name] = path
    return out


def _imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(module imported, names imported from it) for every import in ``path``."""
    files = [path] if path.is_file() else sorted(path.glob("*.py"))
    found = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                found += [(alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append((node.module, tuple(alias.name for alias in node.names)))
    return found


def _within(module: str) -> str | None:
    """The map's name of a meshfeed module (``meshfeed._cli.demo`` -> ``_cli``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "meshfeed" and len(parts) > 1 else None


def test_the_module_map_lists_every_module_once():
    listed = _module_map()
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(_modules())


def test_every_import_points_down_the_map():
    order = {name: i for i, name in enumerate(_module_map())}
    for name, path in _modules().items():
        for module, _ in _imports(path):
            target = _within(module)
            if module == "meshfeed":  # the whole package: only the command on top may
                assert name == "_cli", f"{name} imports the meshfeed package"
            elif target is not None and target != name:
                assert order[target] < order[name], f"{name} imports {target}, listed after it"


def test_no_underscore_name_crosses_modules():
    for name, path in _modules().items():
        for module, names in _imports(path):
            if _within(module) not in (None, name):
                private = [n for n in names if n.startswith("_")]
                assert not private, f"{name} imports {private} from {module}"


def test_the_data_layer_renders_nothing():
    listed = _module_map()
    data_layer = listed[: listed.index(DATA_LAYER_TOP) + 1]
    for name in data_layer:
        for module, _ in _imports(_modules()[name]):
            assert module.split(".")[0] not in RENDERERS, f"{name} imports {module}"


def test_benchmarks_use_public_names_only():
    for path in (ROOT / "benchmarks").glob("*.py"):
        for module, names in _imports(path):
            if module.split(".")[0] != "meshfeed":
                continue
            private = [part for part in (*module.split("."), *names) if part.startswith("_")]
            assert not private, f"{path.name} imports {private} from {module}"
