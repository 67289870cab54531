"""Seeing into it: layouts, plans, packed rows and the pipeline, as text and as pictures.

``show_sharding`` prints which device and process holds which block of any array, of any
rank, the same on every process; ``plot_sharding`` draws it; ``show_plan`` prints what
each loading strategy reads, copies and moves per step (and the stages ahead);
``plot_packing`` draws packed rows by document; ``plot_mixture`` each source's share of
the batches over the steps; ``plot_pipeline`` where a step's time goes
(``loader.stats()``). This is the only layer that renders: text with ``rich``, pictures
with matplotlib (the ``plot`` extra, imported when a picture is asked for).

Modules, lowest first (each imports only modules listed before it)::

    _show          show_sharding: a layout as text
    _show_plan     show_plan: a plan as a table
    _plot          plot_sharding: a layout as a picture (the plot extra)
    _plot_packing  plot_packing: packed rows as a picture (the plot extra)
    _plot_mixture  plot_mixture: a mixture's shares over the steps (the plot extra)
    _plot_pipeline plot_pipeline: where a step's time goes, stage by stage (the plot extra)

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
