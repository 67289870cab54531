"""Sources and formats: every way to read examples by index, and what they are built of.

The sources most users need are at the top level too (``meshfeed.ArraySource``,
``meshfeed.open_source``, ``meshfeed.write_source``, ``meshfeed.pack``,
``meshfeed.mix``, ``meshfeed.index``, ``meshfeed.Ragged``); this module holds the rest:
the readers of Parquet, Hugging Face, Grain, PyTorch and ArrayRecord datasets, of
WebDataset tar shards, JSON Lines and TFRecord files, and the sources that ``mix``,
``pack`` and ``select`` return, and ``context_layout``: rows laid out for a context
mesh axis.
"""

from meshfeed.data._adapters import ArrayRecordSource as ArrayRecordSource
from meshfeed.data._adapters import GrainSource as GrainSource
from meshfeed.data._adapters import TorchSource as TorchSource
from meshfeed.data._arrow import HFSource as HFSource
from meshfeed.data._context_layout import ContextLayout as ContextLayout
from meshfeed.data._context_layout import context_layout as context_layout
from meshfeed.data._mix import Mixture as Mixture
from meshfeed.data._pack_plan import PackPlan as PackPlan
from meshfeed.data._pack_store import StoredPlan as StoredPlan
from meshfeed.data._packed import Packed as Packed
from meshfeed.data._parquet import ParquetSource as ParquetSource
from meshfeed.data._selection import Selection as Selection
from meshfeed.data._sharded import ShardedSource as ShardedSource
from meshfeed.data._sources import BalancedSteps as BalancedSteps
from meshfeed.data._sources import Column as Column
from meshfeed.data._sources import FieldSpec as FieldSpec
from meshfeed.data._sources import Origins as Origins
from meshfeed.data._sources import PartialRows as PartialRows
from meshfeed.formats._build import IndexReport as IndexReport
from meshfeed.formats._jsonl import JsonlSource as JsonlSource
from meshfeed.formats._tar import TarSource as TarSource
from meshfeed.formats._tfrecord import TFRecordSource as TFRecordSource
from meshfeed.formats._tfrecord import parse_example as parse_example
from meshfeed.prepare._prepare import PrepareStatus as PrepareStatus
from meshfeed.storage._file_errors import BadFileError as BadFileError

__all__ = [
    "ArrayRecordSource",
    "BadFileError",
    "BalancedSteps",
    "Column",
    "ContextLayout",
    "FieldSpec",
    "GrainSource",
    "HFSource",
    "IndexReport",
    "JsonlSource",
    "Mixture",
    "Origins",
    "PackPlan",
    "Packed",
    "ParquetSource",
    "PartialRows",
    "PrepareStatus",
    "Selection",
    "ShardedSource",
    "StoredPlan",
    "TFRecordSource",
    "TarSource",
    "TorchSource",
    "context_layout",
    "parse_example",
]
