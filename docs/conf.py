"""Sphinx configuration: MyST Markdown pages, the API reference from the docstrings.

Built with warnings as errors (``python3 -m sphinx -W -n docs docs/_build``): a broken
cross-reference, a public name without a docstring or a page outside the tree fails the
build. No intersphinx: the build runs without network, so references to JAX, numpy and
the standard library are left as text (``nitpick_ignore_regex`` below).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
os.environ.setdefault("KERAS_BACKEND", "jax")  # meshfeed.keras is documented on JAX

project = "meshfeed"
author = "the meshfeed developers"
copyright = "2026, the meshfeed developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "public_names",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "generated/*.md", "README.md"]
templates_path = ["_templates"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autosummary_generate = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# meshfeed's type aliases by name in signatures, linked to their entries (not expanded).
# Transform, RecordFn, EvalFn, Batch, Column and LongDocs stay expanded: Sphinx 9 cannot
# render an alias inside ``X | None`` or a generic (it prints ``TypeAliasForwardRef(...)``).
autodoc_type_aliases = {
    name: f"meshfeed.{home}.{name}"
    for home, names in {
        "types": (
            "Algorithm",
            "AxisTypes",
            "LastBatch",
            "Prefetch",
            "ShardingArg",
            "Strategy",
            "WorkerType",
        ),
        "train": ("LossFn", "Mode", "StepFn"),
    }.items()
    for name in names
} | {"MatmulStrategy": "meshfeed.ops.MatmulStrategy"}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

nitpicky = True
nitpick_ignore_regex = [
    # Other projects' names (no intersphinx without network) and typing helpers.
    (
        r"py:.*",
        r"(jax|jaxlib|np|numpy|optax|keras|flax|nnx|orbax|rich|matplotlib|fsspec|"
        r"pyarrow|datasets|grain|torch|array_record|typing|typing_extensions|collections|os|"
        r"pathlib|concurrent|subprocess|socket|threading|enum|dataclasses)(\..*)?",
    ),
    (
        r"py:.*",
        r"(Any|Callable|Iterator|Iterable|Mapping|Sequence|Literal|NamedTuple|T|"
        r"Self|ArrayLike|DTypeLike|PyTree|Generic|Protocol)",
    ),
    (r"py:class", r"meshfeed\..*\.(T|V)"),  # type variables of generic classes
    (
        r"py:class",
        r"(Mesh|NamedSharding|PartitionSpec|P|Sharding|Device|AxisType|Array|"
        r"ndarray|dtype|Path|PathLike|Popen|Thread|Console|Figure|Axes|Model|Optimizer|"
        r"GradientTransformation|OptState|Module|Dataset|HistoryCallback)",
    ),
    # ShardedSource's constructor takes the row readers open_source builds; users call
    # open_source, so the readers are not public.
    (r"py:class", r"meshfeed\.data\._files\.(NpyRows|RaggedRows)"),
]

html_theme = "sphinx_book_theme"
html_title = "meshfeed"
html_theme_options = {"show_toc_level": 2}
