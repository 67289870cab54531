"""A Sphinx extension that holds the reference to the code: every public name documented.

* A public name whose docstring is empty is a warning (and, with ``-W``, a failed
  build): ``autodoc-process-docstring`` sees each object the reference documents.
* A re-exported constant or type alias (``meshfeed.DATA``, ``meshfeed.types.Strategy``) has no
  ``__doc__`` of its own: its docstring is the string literal under its assignment in
  the module that defines it, found here by reading meshfeed's sources once.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)
SOURCE = Path(__file__).resolve().parents[2] / "src" / "meshfeed"


def attribute_docs() -> dict[str, list[str]]:
    """name -> docstring lines of every module-level assignment followed by a string."""
    found: dict[str, list[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        body = ast.parse(path.read_text()).body
        for node, after in itertools.pairwise(body):
            target = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            elif isinstance(node, ast.AnnAssign):
                target = node.target
            if not isinstance(target, ast.Name):
                continue
            value = after.value if isinstance(after, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.setdefault(target.id, value.value.strip().splitlines())
    return found


_DOCS: dict[str, list[str]] = {}


def _fill_and_check(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    if what in ("data", "attribute"):
        short = name.rsplit(".", 1)[-1]
        own = getattr(type(obj), "__doc__", None)
        inherited = own.strip().splitlines() if isinstance(own, str) else []
        if lines and [x.strip() for x in lines if x.strip()] == [x.strip() for x in inherited]:
            lines[:] = []  # a str's or a tuple's own docstring says nothing of this name
        if not any(line.strip() for line in lines) and _is_module_level(name):
            lines[:] = list(_DOCS.get(short, []))
    if what == "module":
        return
    if not any(line.strip() for line in lines):
        logger.warning(f"{name} has no docstring: say what it is for in its first line.")


def _is_module_level(name: str) -> bool:
    module = name.rsplit(".", 1)[0]
    return module in (
        "meshfeed",
        "meshfeed.ops",
        "meshfeed.testing",
        "meshfeed.keras",
        "meshfeed.flax",
        "meshfeed.sources",
        "meshfeed.schedules",
        "meshfeed.inspect",
        "meshfeed.train",
        "meshfeed.types",
        "meshfeed.vision",
    )


def _plain_defaults(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    annotation: str | None,
) -> tuple[str | None, str | None]:
    """A dataclass field's ``default_factory`` shows as ``<factory>``, which the signature
    parser cannot read: show ``...`` instead."""
    if signature:
        signature = signature.replace("<factory>", "...")
    return signature, annotation


def setup(app: Sphinx) -> dict[str, Any]:
    _DOCS.update(attribute_docs())
    app.connect("autodoc-process-docstring", _fill_and_check)
    app.connect("autodoc-process-signature", _plain_defaults)
    return {"parallel_read_safe": True}
