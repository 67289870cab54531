"""meshfeed: feed JAX device meshes.

Turns a dataset into global ``jax.Array`` batches laid out by any ``NamedSharding``, on
one process or many, exactly and resumably. Importing meshfeed touches no device, so
``jax.distributed.initialize`` (or ``meshfeed.initialize``) may still follow.
"""

from meshfeed import ops as ops
from meshfeed._adapters import ArrayRecordSource as ArrayRecordSource
from meshfeed._adapters import GrainSource as GrainSource
from meshfeed._adapters import TorchSource as TorchSource
from meshfeed._arrays import ArraySource as ArraySource
from meshfeed._arrow import HFSource as HFSource
from meshfeed._arrow import ParquetSource as ParquetSource
from meshfeed._attention import segment_mask as segment_mask
from meshfeed._checkpoint import restore_checkpoint as restore_checkpoint
from meshfeed._checkpoint import save_checkpoint as save_checkpoint
from meshfeed._fit import EvalFn as EvalFn
from meshfeed._fit import History as History
from meshfeed._fit import StepFn as StepFn
from meshfeed._fit import fit as fit
from meshfeed._initialize import initialize as initialize
from meshfeed._launch import launch as launch
from meshfeed._loader import Loader as Loader
from meshfeed._mesh import DATA as DATA
from meshfeed._mesh import MODEL as MODEL
from meshfeed._mesh import AxisTypes as AxisTypes
from meshfeed._mesh import batch_sharding as batch_sharding
from meshfeed._mesh import make_mesh as make_mesh
from meshfeed._mix import Mixture as Mixture
from meshfeed._mix import mix as mix
from meshfeed._options import LoaderOptions as LoaderOptions
from meshfeed._options import Prefetch as Prefetch
from meshfeed._options import Transform as Transform
from meshfeed._pack import Packed as Packed
from meshfeed._pack import pack as pack
from meshfeed._pack_plan import Algorithm as Algorithm
from meshfeed._pack_plan import LongDocs as LongDocs
from meshfeed._pack_plan import PackPlan as PackPlan
from meshfeed._plan import STRATEGIES as STRATEGIES
from meshfeed._plan import Cost as Cost
from meshfeed._plan import Fetches as Fetches
from meshfeed._plan import Plan as Plan
from meshfeed._plan import Strategy as Strategy
from meshfeed._plan import plan as plan
from meshfeed._plot import plot_sharding as plot_sharding
from meshfeed._plot_packing import plot_packing as plot_packing
from meshfeed._ragged import Ragged as Ragged
from meshfeed._record_rows import RecordFn as RecordFn
from meshfeed._records import WorkerType as WorkerType
from meshfeed._replicas import check_replicas as check_replicas
from meshfeed._schedule import LastBatch as LastBatch
from meshfeed._schedule import Permutation as Permutation
from meshfeed._schedule import Schedule as Schedule
from meshfeed._shardings import ShardingArg as ShardingArg
from meshfeed._show import show_sharding as show_sharding
from meshfeed._show_plan import show_plan as show_plan
from meshfeed._sources import Column as Column
from meshfeed._sources import FieldSpec as FieldSpec
from meshfeed._sources import Source as Source
from meshfeed._state import LoaderState as LoaderState
from meshfeed._store import ShardedSource as ShardedSource
from meshfeed._store import open_source as open_source
from meshfeed._strategies import reshard as reshard
from meshfeed._train import MODES as MODES
from meshfeed._train import Batch as Batch
from meshfeed._train import LossFn as LossFn
from meshfeed._train import Mode as Mode
from meshfeed._train import collective_axes as collective_axes
from meshfeed._train import make_train_step as make_train_step
from meshfeed._train import masked_mean as masked_mean
from meshfeed._train_state import TrainState as TrainState
from meshfeed._writer import write_source as write_source

__version__ = "0.1.0"

__all__ = [
    "DATA",
    "MODEL",
    "MODES",
    "STRATEGIES",
    "Algorithm",
    "ArrayRecordSource",
    "ArraySource",
    "AxisTypes",
    "Batch",
    "Column",
    "Cost",
    "EvalFn",
    "Fetches",
    "FieldSpec",
    "GrainSource",
    "HFSource",
    "History",
    "LastBatch",
    "Loader",
    "LoaderOptions",
    "LoaderState",
    "LongDocs",
    "LossFn",
    "Mixture",
    "Mode",
    "PackPlan",
    "Packed",
    "ParquetSource",
    "Permutation",
    "Plan",
    "Prefetch",
    "Ragged",
    "RecordFn",
    "Schedule",
    "ShardedSource",
    "ShardingArg",
    "Source",
    "StepFn",
    "Strategy",
    "TorchSource",
    "TrainState",
    "Transform",
    "WorkerType",
    "batch_sharding",
    "check_replicas",
    "collective_axes",
    "fit",
    "initialize",
    "launch",
    "make_mesh",
    "make_train_step",
    "masked_mean",
    "mix",
    "open_source",
    "ops",
    "pack",
    "plan",
    "plot_packing",
    "plot_sharding",
    "reshard",
    "restore_checkpoint",
    "save_checkpoint",
    "segment_mask",
    "show_plan",
    "show_sharding",
    "write_source",
]
