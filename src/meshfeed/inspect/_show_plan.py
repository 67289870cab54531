"""A plan as a table: what each loading strategy reads, copies and moves per step.

The planner (``meshfeed.inspect.plan``, ``loader.plan``) computes the numbers in the data layer;
drawing them is this module's job, so the data layer renders nothing.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping

from rich import box
from rich.console import Console
from rich.table import Table

from meshfeed.feed._plan import Plan, PodCost
from meshfeed.feed._timeline import Span, weights_text

_HEADINGS = ("strategy", "rows read", "bytes read", "host->device", "device<->device")


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _per_process(values: Mapping[int, int], fmt: Callable[[int], str]) -> str:
    distinct = set(values.values())
    if len(distinct) == 1:
        return f"{fmt(next(iter(distinct)))} each"
    return "/".join(fmt(values[p]) for p in sorted(values))


def show_plan(plan: Plan) -> str:
    """The costs of every strategy as a table, the one in use marked, and why.

    Example:
      >>> print(meshfeed.show_plan(loader.plan))  # doctest: +SKIP
    """
    if not isinstance(plan, Plan):
        raise TypeError(
            f"show_plan takes a Plan (from meshfeed.inspect.plan or loader.plan), got "
            f"{type(plan).__name__}."
        )
    table = Table(box=box.SIMPLE_HEAD, title_justify="left")
    for heading in _HEADINGS:
        table.add_column(heading, justify="left" if heading == "strategy" else "right")
    for name, cost in plan.costs.items():
        table.add_row(
            name + ("  <-" if name == plan.strategy else ""),
            _per_process(cost.rows_read, str),
            _per_process(cost.bytes_read, _bytes),
            _per_process(cost.host_to_device, _bytes),
            _bytes(cost.device_to_device),
        )
    out = io.StringIO()
    Console(file=out, width=110, color_system=None, highlight=False).print(table)
    fields = ", ".join(f"{k} {v}" for k, v in plan.fields.items())
    fetched = ""
    if plan.fetches is not None:
        f = plan.fetches
        fetched = (
            f"from {f.url}: {f.requests:.1f} range requests and {_bytes(round(f.bytes))} "
            f"per step on this process (the mean of the next {f.steps} steps)\n"
        )
    pod = "" if plan.pod is None else _pod(plan.pod)
    ahead = ""
    if plan.schedule:
        ahead = "schedule ahead:\n" + "".join(f"  {_span(s)}\n" for s in plan.schedule)
    across = ", ".join(plan.across_processes) or "none"
    return (
        f"plan for global_batch_size={plan.global_batch_size} on {plan.processes} "
        f"process(es); fields: {fields}\nmesh axes across processes: {across}\n"
        "per step and per process ('x each': the same on every "
        "process; 'x/y': process 0/process 1); device<->device: all devices together\n"
        f"{out.getvalue().rstrip()}\n{plan.summary}\n{fetched}{pod}{ahead}"
    )


def _pod(pod: PodCost) -> str:
    """What the pod's hosts ask of the store, at its rate."""
    kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(pod.startup.items())) or "none"
    rate = f"{pod.store_rps:,.0f} requests/s"
    return (
        f"{pod.processes:,} processes over {pod.url} (the store at {rate}):\n"
        f"  start-up: {pod.startup_requests:,} request(s) a process ({kinds}); "
        f"{pod.pod_startup_requests:,} for the pod: {_seconds(pod.startup_seconds)} of the "
        "store's rate\n"
        f"  a step: {pod.step_requests:,.1f} requests and {_bytes(round(pod.step_bytes))} a "
        f"process; {pod.pod_step_requests:,.0f} requests and "
        f"{_bytes(round(pod.step_bytes * pod.processes))} for the pod: "
        f"{_seconds(pod.step_seconds)} of the store's rate (a step faster than that waits "
        f"on the store; mean of the first {pod.steps} steps)\n{_first_reads(pod)}"
    )


def _first_reads(pod: PodCost) -> str:
    """A file's first read: what it costs a host, and the pod over every file."""
    if pod.first_read is None:
        return ""
    line = f"  a shard's first read: {pod.first_read:,} request(s) before its data"
    if pod.host_first_reads is not None:
        pod_total = pod.host_first_reads * pod.processes
        line += (
            f"; over all {pod.files:,} shards, {pod.host_first_reads:,} a process and "
            f"{pod_total:,} for the pod ({_seconds(pod_total / pod.store_rps)} of the "
            "store's rate), within the first epoch of a global shuffle"
        )
    return line + "\n"


def _seconds(s: float) -> str:
    if s < 120:
        return f"{s:,.2f} s"
    if s < 7200:
        return f"{s / 60:,.1f} min"
    return f"{s / 3600:,.1f} h"


def _span(span: Span) -> str:
    """One span of steps: ``steps 6-9  batch 16  mix stage 1 (blending a -> b ...)``."""
    steps = f"steps {span.first}-{'' if span.last is None else span.last}"
    text = f"{steps:<16}batch {span.batch_size}"
    if span.mix_stage is not None and span.weights is not None:
        text += f"  mix stage {span.mix_stage} "
        if span.blend_from is not None and span.blend_steps is not None:
            a, b = span.blend_steps
            text += f"(blending {weights_text(span.blend_from)} -> {weights_text(span.weights)} "
            text += f"over steps {a}-{b})"
        else:
            text += f"({weights_text(span.weights)})"
    return text
