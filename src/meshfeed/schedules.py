"""Schedules: which examples each step reads, and settings that change by step.

``Stages`` (a batch size that ramps, mixture weights that change) is the one most users
pass; ``Schedule`` is the loader's map from a step to its example ids, computed by every
process on its own from the seed, the epoch and the batch size; ``Permutation`` the keyed
shuffle it orders each epoch with.
"""

from meshfeed.core._permutation import Permutation as Permutation
from meshfeed.core._stages import BatchSizes as BatchSizes
from meshfeed.core._stages import Stage as Stage
from meshfeed.core._stages import Stages as Stages
from meshfeed.feed._schedule import Schedule as Schedule
from meshfeed.feed._timeline import Span as Span
from meshfeed.feed._timeline import StepStage as StepStage

__all__ = ["BatchSizes", "Permutation", "Schedule", "Span", "Stage", "Stages", "StepStage"]
