"""meshfeed: feed JAX device meshes.

Turns a dataset into global ``jax.Array`` batches laid out by any ``NamedSharding``, on
one process or many, exactly and resumably. Importing meshfeed touches no device, so
``jax.distributed.initialize`` (or ``meshfeed.initialize``) may still follow.

The top level holds what most jobs use; the rest lives in modules named for what they
hold: ``meshfeed.sources`` (sources and formats), ``meshfeed.schedules``,
``meshfeed.inspect`` (pictures, plans, checks), ``meshfeed.train`` (step types, modes),
``meshfeed.types`` (argument types), ``meshfeed.ops``, ``meshfeed.vision`` (image
decode and crops); and, imported on their own,
``meshfeed.keras``, ``meshfeed.flax`` and ``meshfeed.testing``.
"""

import importlib
import warnings
from typing import Any

from meshfeed import inspect as inspect
from meshfeed import ops as ops
from meshfeed import schedules as schedules
from meshfeed import sources as sources
from meshfeed import train as train
from meshfeed import types as types
from meshfeed import vision as vision
from meshfeed.cluster._initialize import initialize as initialize
from meshfeed.cluster._initialize import shutdown as shutdown
from meshfeed.cluster._initialize import watch as watch
from meshfeed.cluster._launch import launch as launch
from meshfeed.core._mesh import CONTEXT as CONTEXT
from meshfeed.core._mesh import DATA as DATA
from meshfeed.core._mesh import MODEL as MODEL
from meshfeed.core._mesh import batch_sharding as batch_sharding
from meshfeed.core._mesh import make_mesh as make_mesh
from meshfeed.data._arrays import ArraySource as ArraySource
from meshfeed.data._image_folder import ImageFolderSource as ImageFolderSource
from meshfeed.data._mix import mix as mix
from meshfeed.data._pack import pack as pack
from meshfeed.data._ragged import Ragged as Ragged
from meshfeed.data._sources import Source as Source
from meshfeed.data._store import open_source as open_source
from meshfeed.data._writer import write_source as write_source
from meshfeed.feed._loader import Loader as Loader
from meshfeed.feed._state import LoaderState as LoaderState
from meshfeed.feed._strategies import reshard as reshard
from meshfeed.formats._build import index as index
from meshfeed.inspect._show import show_sharding as show_sharding
from meshfeed.inspect._show_plan import show_plan as show_plan
from meshfeed.prepare._prepare import prepare as prepare
from meshfeed.prepare._prepare import prepare_status as prepare_status
from meshfeed.prepare._select import select as select
from meshfeed.train._attention import segment_mask as segment_mask
from meshfeed.train._checkpoint import restore_checkpoint as restore_checkpoint
from meshfeed.train._checkpoint import save_checkpoint as save_checkpoint
from meshfeed.train._fit import fit as fit
from meshfeed.train._step_parts import masked_mean as masked_mean
from meshfeed.train._steps import make_train_step as make_train_step
from meshfeed.train._train_state import TrainState as TrainState

__version__ = "0.1.0"

__all__ = [
    "CONTEXT",
    "DATA",
    "MODEL",
    "ArraySource",
    "ImageFolderSource",
    "Loader",
    "LoaderState",
    "Ragged",
    "Source",
    "TrainState",
    "batch_sharding",
    "fit",
    "index",
    "initialize",
    "inspect",
    "launch",
    "make_mesh",
    "make_train_step",
    "masked_mean",
    "mix",
    "open_source",
    "ops",
    "pack",
    "prepare",
    "prepare_status",
    "reshard",
    "restore_checkpoint",
    "save_checkpoint",
    "schedules",
    "segment_mask",
    "select",
    "show_plan",
    "show_sharding",
    "shutdown",
    "sources",
    "train",
    "types",
    "vision",
    "watch",
    "write_source",
]

_HOMES = ("sources", "schedules", "inspect", "train", "types")
"""The modules that names left the top level for, in the order they are looked up."""


def __getattr__(name: str) -> Any:
    """A name that left the top level: found in its new home, with a warning that says
    where (it stays here for one release)."""
    for home in _HOMES:
        module = importlib.import_module(f"meshfeed.{home}")
        if name in module.__all__:
            warnings.warn(
                f"meshfeed.{name} moved to meshfeed.{home}.{name}; import it from there "
                f"(meshfeed.{name} goes in the next release).",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(module, name)
    raise AttributeError(f"module 'meshfeed' has no attribute {name!r}")
