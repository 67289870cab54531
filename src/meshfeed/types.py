"""The types of meshfeed's arguments: aliases, literals and option bundles.

For annotating code that passes them on (``def make_loader(sharding:
meshfeed.types.ShardingArg)``); nothing here is needed to call meshfeed.
"""

from meshfeed.cluster._ray_connect import RayOptions as RayOptions
from meshfeed.core._context_layout import ContextKind as ContextKind
from meshfeed.core._mesh import AxisTypes as AxisTypes
from meshfeed.core._stages import BatchSizeArg as BatchSizeArg
from meshfeed.data._bad_records import OnError as OnError
from meshfeed.data._mix import WeightsArg as WeightsArg
from meshfeed.data._nulls import Fill as Fill
from meshfeed.data._pack_build import PlanExecutor as PlanExecutor
from meshfeed.data._pack_plan import Algorithm as Algorithm
from meshfeed.data._pack_plan import LongDocs as LongDocs
from meshfeed.data._row_cost import Balance as Balance
from meshfeed.data._tokenizer import TokenizerFunction as TokenizerFunction
from meshfeed.feed._options import LoaderOptions as LoaderOptions
from meshfeed.feed._options import PlaceThreads as PlaceThreads
from meshfeed.feed._options import Prefetch as Prefetch
from meshfeed.feed._options import Transform as Transform
from meshfeed.feed._plan import Strategy as Strategy
from meshfeed.feed._schedule import LastBatch as LastBatch
from meshfeed.feed._shardings import ShardingArg as ShardingArg
from meshfeed.formats._jsonl import JsonlType as JsonlType
from meshfeed.formats._tar import TarDecoder as TarDecoder
from meshfeed.formats._tar import TarMissing as TarMissing
from meshfeed.formats._tfrecord import FeatureType as FeatureType
from meshfeed.prepare._prepare import PrepareExecutor as PrepareExecutor
from meshfeed.prepare._prepare import TxtMode as TxtMode
from meshfeed.prepare._select import SelectExecutor as SelectExecutor
from meshfeed.train._param_sharding import ParamRule as ParamRule
from meshfeed.train._param_sharding import ParamSharding as ParamSharding
from meshfeed.workers._record_rows import RecordFn as RecordFn
from meshfeed.workers._records import WorkerType as WorkerType

__all__ = [
    "Algorithm",
    "AxisTypes",
    "Balance",
    "BatchSizeArg",
    "ContextKind",
    "FeatureType",
    "Fill",
    "JsonlType",
    "LastBatch",
    "LoaderOptions",
    "LongDocs",
    "OnError",
    "ParamRule",
    "ParamSharding",
    "PlaceThreads",
    "PlanExecutor",
    "Prefetch",
    "PrepareExecutor",
    "RayOptions",
    "RecordFn",
    "SelectExecutor",
    "ShardingArg",
    "Strategy",
    "TarDecoder",
    "TarMissing",
    "TokenizerFunction",
    "Transform",
    "TxtMode",
    "WeightsArg",
    "WorkerType",
]
