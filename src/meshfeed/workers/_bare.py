"""Python processes that import meshfeed bare: no JAX, no user script run again.

Worker processes (record transforms, ``prepare``'s tokenizers) start with ``python -c``,
not with ``multiprocessing``'s spawn or fork: nothing of the user's script runs again in
them (a script without the ``if __name__ == "__main__":`` guard, a notebook and stdin
all work), and no process that runs JAX is forked. The bootstrap makes ``meshfeed`` a
bare package whose ``__init__`` -- which imports JAX -- runs only if something reaches
for ``meshfeed.<name>`` (a user's function, say), so a worker starts with numpy and the
few modules it needs, in a fraction of JAX's import time and memory.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

PACKAGE = str(Path(__file__).resolve().parent.parent)  # the meshfeed/ folder
BOOT = (
    "import importlib, sys, types\n"
    "package = types.ModuleType('meshfeed')\n"
    "package.__path__ = [sys.argv[1]]\n"
    "sys.modules['meshfeed'] = package\n"
    "importlib.import_module(sys.argv[2]).main(package, *sys.argv[3:])\n"
)


def bare_argv(module: str, *args: str) -> list[str]:
    """The command that runs ``module.main(package, *args)`` in a bare meshfeed."""
    return [sys.executable, "-c", BOOT, PACKAGE, module, *args]


def load_on_use(package: types.ModuleType) -> None:
    """Runs the real ``meshfeed/__init__.py`` the first time a name of it is asked for."""

    def __getattr__(name: str) -> Any:
        vars(package).pop("__getattr__", None)
        init = Path(package.__path__[0]) / "__init__.py"
        exec(compile(init.read_text(), str(init), "exec"), vars(package))
        return getattr(package, name)

    package.__getattr__ = __getattr__  # type: ignore[attr-defined]
