"""The folders are the layers, and the imports keep to them (read from the source).

The order of the folders is the architecture page's (``docs/architecture.md``); the
order of the modules inside a folder is its ``__init__.py`` docstring's. An import
points down: to an earlier folder, or to an earlier module of the same folder.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "meshfeed"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
LAYERS = (
    "core",
    "cluster",
    "storage",
    "data",
    "workers",
    "formats",
    "prepare",
    "feed",
    "train",
    "inspect",
)
"""The layer folders, each with an ordered module list in its docstring."""
QUIET = ("core", "cluster", "storage", "data", "workers", "formats", "feed")
"""Folders that render nothing (no rich, no matplotlib); prepare draws its progress bar."""
RENDERERS = ("rich", "matplotlib")
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 200
MAX_FORMAT_SKIPS = 10


def _unit_order() -> list[str]:
    """The architecture page's list: folders (``data/``) and top modules (``keras.py``)."""
    section = ARCHITECTURE.read_text().split("## The folders", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, flags=re.S)
    assert block is not None, "docs/architecture.md: no ```text block under '## The folders'"
    names = [line.split()[0] for line in block.group(1).splitlines() if line.strip()]
    return [n.rstrip("/").removesuffix(".py") for n in names]


def _units() -> dict[str, Path]:
    """Folder or top module name -> its path, as on disk."""
    return {
        (p.stem if p.suffix == ".py" else p.name): p
        for p in PACKAGE.iterdir()
        if p.name not in ("__init__.py", "__main__.py", "__pycache__")
    }


def _module_order(layer: str) -> list[str]:
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text())) or ""
    assert "Modules, lowest first" in doc, f"{layer}/__init__.py lists no modules"
    listing = doc.split("Modules, lowest first", 1)[1]
    return re.findall(r"^    (_\w+) ", listing, flags=re.M)


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def _imports(file: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(module imported, names imported from it) for every import in ``file``."""
    found = []
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, tuple(alias.name for alias in node.names)))
    return found


def _place(module: str) -> tuple[str, str | None] | None:
    """(unit, module within the unit) of a meshfeed module, or None for others."""
    parts = module.split(".")
    if parts[0] != "meshfeed" or len(parts) == 1:
        return None
    return parts[1], (parts[2] if len(parts) > 2 else None)


def _where(file: Path) -> tuple[str, str | None]:
    relative = file.relative_to(PACKAGE).with_suffix("")
    parts = relative.parts
    return parts[0], (parts[1] if len(parts) > 1 and parts[1] != "__init__" else None)


def _all_files() -> list[Path]:
    return [f for path in _units().values() for f in _files(path)]


def test_the_architecture_page_lists_every_folder_and_top_module_once():
    order = _unit_order()
    assert len(order) == len(set(order))
    assert sorted(order) == sorted(_units())
    assert [u for u in order if u in LAYERS] == list(LAYERS)


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_says_what_it_holds_and_lists_its_modules(layer):
    listed = _module_order(layer)
    on_disk = sorted(p.stem for p in (PACKAGE / layer).glob("_*.py") if p.stem != "__init__")
    assert len(listed) == len(set(listed))
    assert sorted(listed) == on_disk


def test_every_import_points_down():
    units = {name: i for i, name in enumerate(_unit_order())}
    modules = {layer: {m: i for i, m in enumerate(_module_order(layer))} for layer in LAYERS}
    for file in _all_files():
        unit, module = _where(file)
        for imported, _ in _imports(file):
            if imported == "meshfeed":  # the whole package: only the command on top may
                assert unit == "_cli", f"{file} imports the meshfeed package"
                continue
            place = _place(imported)
            if place is None:
                continue
            target, target_module = place
            if target != unit:
                assert units[target] < units[unit], f"{file} imports {imported}, a layer above"
            elif unit in LAYERS and module is not None and target_module is not None:
                order = modules[unit]
                assert order[target_module] < order[module], (
                    f"{file} imports {imported}, listed after it in {unit}/__init__.py"
                )


def test_no_underscore_name_crosses_modules():
    for file in _all_files():
        unit, module = _where(file)
        for imported, names in _imports(file):
            place = _place(imported)
            if place is not None and place != (unit, module):
                private = [n for n in names if n.startswith("_")]
                assert not private, f"{file} imports {private} from {imported}"


def test_the_lower_layers_render_nothing():
    for layer in QUIET:
        for file in _files(PACKAGE / layer):
            for imported, _ in _imports(file):
                assert imported.split(".")[0] not in RENDERERS, f"{file} imports {imported}"


def test_no_module_is_two_concepts():
    """A module past 400 lines, or a class past 200, is two concepts (STYLE.md)."""
    for file in _all_files():
        lines = file.read_text().splitlines()
        assert len(lines) <= MAX_MODULE_LINES, f"{file} has {len(lines)} lines"
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                assert size <= MAX_CLASS_LINES, f"{file}: class {node.name} has {size} lines"


def test_no_code_is_squeezed_under_the_caps():
    """``# fmt: skip`` only where a table of literals reads better aligned, each with its
    reason on the line above (STYLE.md: never squeeze code to fit a cap)."""
    skipped = [
        (file, i)
        for file in _all_files()
        for i, line in enumerate(file.read_text().splitlines())
        if "# fmt: skip" in line or "# fmt: off" in line
    ]
    assert len(skipped) <= MAX_FORMAT_SKIPS, f"{len(skipped)} lines: {skipped}"
    for file, i in skipped:
        above = file.read_text().splitlines()[i - 1].strip()
        assert above.startswith("#"), f"{file}:{i + 1} keeps its layout without a reason"


def test_benchmarks_use_public_names_only():
    for path in (ROOT / "benchmarks").glob("*.py"):
        for module, names in _imports(path):
            if module.split(".")[0] != "meshfeed":
                continue
            private = [part for part in (*module.split("."), *names) if part.startswith("_")]
            assert not private, f"{path.name} imports {private} from {module}"
