"""meshfeed: feed JAX device meshes.

Turns a dataset into global ``jax.Array`` batches laid out by any ``NamedSharding``, on
one process or many, exactly and resumably. Importing meshfeed touches no device, so
``jax.distributed.initialize`` (or ``meshfeed.initialize``) may still follow.
"""

from meshfeed import ops as ops
from meshfeed.cluster._initialize import initialize as initialize
from meshfeed.cluster._initialize import shutdown as shutdown
from meshfeed.cluster._initialize import watch as watch
from meshfeed.cluster._launch import launch as launch
from meshfeed.core._mesh import DATA as DATA
from meshfeed.core._mesh import MODEL as MODEL
from meshfeed.core._mesh import AxisTypes as AxisTypes
from meshfeed.core._mesh import batch_sharding as batch_sharding
from meshfeed.core._mesh import make_mesh as make_mesh
from meshfeed.core._permutation import Permutation as Permutation
from meshfeed.core._stages import BatchSizeArg as BatchSizeArg
from meshfeed.core._stages import BatchSizes as BatchSizes
from meshfeed.core._stages import Stage as Stage
from meshfeed.core._stages import Stages as Stages
from meshfeed.data._adapters import ArrayRecordSource as ArrayRecordSource
from meshfeed.data._adapters import GrainSource as GrainSource
from meshfeed.data._adapters import TorchSource as TorchSource
from meshfeed.data._arrays import ArraySource as ArraySource
from meshfeed.data._arrow import HFSource as HFSource
from meshfeed.data._bad_records import OnError as OnError
from meshfeed.data._mix import Mixture as Mixture
from meshfeed.data._mix import WeightsArg as WeightsArg
from meshfeed.data._mix import mix as mix
from meshfeed.data._pack import Packed as Packed
from meshfeed.data._pack import pack as pack
from meshfeed.data._pack_plan import Algorithm as Algorithm
from meshfeed.data._pack_plan import LongDocs as LongDocs
from meshfeed.data._pack_plan import PackPlan as PackPlan
from meshfeed.data._parquet import ParquetSource as ParquetSource
from meshfeed.data._ragged import Ragged as Ragged
from meshfeed.data._selection import Selection as Selection
from meshfeed.data._sharded import ShardedSource as ShardedSource
from meshfeed.data._sources import Column as Column
from meshfeed.data._sources import FieldSpec as FieldSpec
from meshfeed.data._sources import Source as Source
from meshfeed.data._store import open_source as open_source
from meshfeed.data._tokenizer import TokenizerFunction as TokenizerFunction
from meshfeed.data._writer import write_source as write_source
from meshfeed.feed._loader import Loader as Loader
from meshfeed.feed._options import LoaderOptions as LoaderOptions
from meshfeed.feed._options import PlaceThreads as PlaceThreads
from meshfeed.feed._options import Prefetch as Prefetch
from meshfeed.feed._options import Transform as Transform
from meshfeed.feed._plan import STRATEGIES as STRATEGIES
from meshfeed.feed._plan import Cost as Cost
from meshfeed.feed._plan import Fetches as Fetches
from meshfeed.feed._plan import Plan as Plan
from meshfeed.feed._plan import PodCost as PodCost
from meshfeed.feed._plan import Strategy as Strategy
from meshfeed.feed._pod import plan as plan
from meshfeed.feed._replicas import check_replicas as check_replicas
from meshfeed.feed._schedule import LastBatch as LastBatch
from meshfeed.feed._schedule import Schedule as Schedule
from meshfeed.feed._shardings import ShardingArg as ShardingArg
from meshfeed.feed._skips import Skipped as Skipped
from meshfeed.feed._state import LoaderState as LoaderState
from meshfeed.feed._strategies import reshard as reshard
from meshfeed.feed._timeline import Span as Span
from meshfeed.feed._timeline import StepStage as StepStage
from meshfeed.formats._build import IndexReport as IndexReport
from meshfeed.formats._build import index as index
from meshfeed.formats._jsonl import JsonlSource as JsonlSource
from meshfeed.formats._jsonl import JsonlType as JsonlType
from meshfeed.formats._tar import TarDecoder as TarDecoder
from meshfeed.formats._tar import TarMissing as TarMissing
from meshfeed.formats._tar import TarSource as TarSource
from meshfeed.formats._tfrecord import FeatureType as FeatureType
from meshfeed.formats._tfrecord import TFRecordSource as TFRecordSource
from meshfeed.formats._tfrecord import parse_example as parse_example
from meshfeed.inspect._plot import plot_sharding as plot_sharding
from meshfeed.inspect._plot_mixture import plot_mixture as plot_mixture
from meshfeed.inspect._plot_packing import plot_packing as plot_packing
from meshfeed.inspect._plot_pipeline import plot_pipeline as plot_pipeline
from meshfeed.inspect._show import show_sharding as show_sharding
from meshfeed.inspect._show_plan import show_plan as show_plan
from meshfeed.prepare._prepare import PrepareExecutor as PrepareExecutor
from meshfeed.prepare._prepare import PrepareStatus as PrepareStatus
from meshfeed.prepare._prepare import TxtMode as TxtMode
from meshfeed.prepare._prepare import prepare as prepare
from meshfeed.prepare._prepare import prepare_status as prepare_status
from meshfeed.prepare._select import SelectExecutor as SelectExecutor
from meshfeed.prepare._select import select as select
from meshfeed.train._attention import segment_mask as segment_mask
from meshfeed.train._checkpoint import restore_checkpoint as restore_checkpoint
from meshfeed.train._checkpoint import save_checkpoint as save_checkpoint
from meshfeed.train._fit import EvalFn as EvalFn
from meshfeed.train._fit import History as History
from meshfeed.train._fit import StepFn as StepFn
from meshfeed.train._fit import fit as fit
from meshfeed.train._steps import MODES as MODES
from meshfeed.train._steps import Batch as Batch
from meshfeed.train._steps import LossFn as LossFn
from meshfeed.train._steps import Mode as Mode
from meshfeed.train._steps import collective_axes as collective_axes
from meshfeed.train._steps import make_train_step as make_train_step
from meshfeed.train._steps import masked_mean as masked_mean
from meshfeed.train._train_state import TrainState as TrainState
from meshfeed.workers._ray_connect import RayOptions as RayOptions
from meshfeed.workers._record_rows import RecordFn as RecordFn
from meshfeed.workers._records import WorkerType as WorkerType

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
    "BatchSizeArg",
    "BatchSizes",
    "Column",
    "Cost",
    "EvalFn",
    "FeatureType",
    "Fetches",
    "FieldSpec",
    "GrainSource",
    "HFSource",
    "History",
    "IndexReport",
    "JsonlSource",
    "JsonlType",
    "LastBatch",
    "Loader",
    "LoaderOptions",
    "LoaderState",
    "LongDocs",
    "LossFn",
    "Mixture",
    "Mode",
    "OnError",
    "PackPlan",
    "Packed",
    "ParquetSource",
    "Permutation",
    "PlaceThreads",
    "Plan",
    "PodCost",
    "Prefetch",
    "PrepareExecutor",
    "PrepareStatus",
    "Ragged",
    "RayOptions",
    "RecordFn",
    "Schedule",
    "SelectExecutor",
    "Selection",
    "ShardedSource",
    "ShardingArg",
    "Skipped",
    "Source",
    "Span",
    "Stage",
    "Stages",
    "StepFn",
    "StepStage",
    "Strategy",
    "TFRecordSource",
    "TarDecoder",
    "TarMissing",
    "TarSource",
    "TokenizerFunction",
    "TorchSource",
    "TrainState",
    "Transform",
    "TxtMode",
    "WeightsArg",
    "WorkerType",
    "batch_sharding",
    "check_replicas",
    "collective_axes",
    "fit",
    "index",
    "initialize",
    "launch",
    "make_mesh",
    "make_train_step",
    "masked_mean",
    "mix",
    "open_source",
    "ops",
    "pack",
    "parse_example",
    "plan",
    "plot_mixture",
    "plot_packing",
    "plot_pipeline",
    "plot_sharding",
    "prepare",
    "prepare_status",
    "reshard",
    "restore_checkpoint",
    "save_checkpoint",
    "segment_mask",
    "select",
    "show_plan",
    "show_sharding",
    "shutdown",
    "watch",
    "write_source",
]
