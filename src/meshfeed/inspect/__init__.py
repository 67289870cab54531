"""Seeing into it: layouts, plans, packed rows and the pipeline, as text and as pictures.

``show_sharding`` prints which device and process holds which block of any array, of any
rank, the same on every process; ``plot_sharding`` draws it; ``show_plan`` prints what
each loading strategy reads, copies and moves per step (and the stages ahead);
``plot_packing`` draws packed rows by document (``step_balance``: what each step of a
pack balanced by cost asks of each device); ``plot_mixture`` each source's share of
the batches over the steps; ``plot_pipeline`` where a step's time goes
(``loader.stats()``). This is the only layer that renders: text with ``rich``, pictures
with matplotlib (the ``plot`` extra, imported when a picture is asked for).

Modules, lowest first (each imports only modules listed before it)::

    _show          show_sharding: a layout as text
    _show_plan     show_plan: a plan as a table
    _plot          plot_sharding: a layout as a picture (the plot extra)
    _step_balance  step_balance: each step's cost on each device, for a pack balanced by cost
    _plot_packing  plot_packing: packed rows as a picture (the plot extra)
    _plot_mixture  plot_mixture: a mixture's shares over the steps (the plot extra)
    _plot_pipeline plot_pipeline: where a step's time goes, stage by stage (the plot extra)

``show_sharding`` and ``show_plan`` are at the top level too; this package exports the
pictures, the planner (``plan`` and what it returns, ``STRATEGIES``), ``check_replicas``
and what ``on_error="skip"`` skipped.
"""

from meshfeed.feed._plan import STRATEGIES as STRATEGIES
from meshfeed.feed._plan import Cost as Cost
from meshfeed.feed._plan import Fetches as Fetches
from meshfeed.feed._plan import Plan as Plan
from meshfeed.feed._plan import PodCost as PodCost
from meshfeed.feed._pod import plan as plan
from meshfeed.feed._replicas import check_replicas as check_replicas
from meshfeed.feed._skips import Skipped as Skipped
from meshfeed.inspect._plot import plot_sharding as plot_sharding
from meshfeed.inspect._plot_mixture import plot_mixture as plot_mixture
from meshfeed.inspect._plot_packing import plot_packing as plot_packing
from meshfeed.inspect._plot_pipeline import plot_pipeline as plot_pipeline
from meshfeed.inspect._step_balance import StepBalance as StepBalance
from meshfeed.inspect._step_balance import step_balance as step_balance

__all__ = [
    "STRATEGIES",
    "Cost",
    "Fetches",
    "Plan",
    "PodCost",
    "Skipped",
    "StepBalance",
    "check_replicas",
    "plan",
    "plot_mixture",
    "plot_packing",
    "plot_pipeline",
    "plot_sharding",
    "step_balance",
]
