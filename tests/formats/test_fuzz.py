"""No input kills the process (issue 71): each reader, fed damaged copies of files its
peer wrote, reads the rows the peer reads or refuses naming the file -- never a hang, a
crash or other rows.

``MESHFEED_FUZZ_FILES`` files a format (2 here, 20 for the closing figures) are each
damaged ``fuzz_fns.MUTATIONS`` times; the files, the mutations, the peers' readings
(the oracles) and the rule for each outcome are in ``fuzz_fns``. Each format's
mutations run in one child process (``python -X faulthandler``): a mutation that ends
it (a crash, or a hang faulthandler's watchdog stops) is counted as *other*, with the
child's last words, and the child is started again after it, so the counts cover every
mutation. The counts, and the *other* and *as written* cases grouped by cause, are
printed whatever pytest captures, and make the failure's message.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fuzz_fns

FILES = int(os.environ.get("MESHFEED_FUZZ_FILES", "2"))
CHILD_S = 120
"""A child's run at most, beside 2 s a mutation (the watchdogs end a stuck one first)."""
HELPERS = Path(__file__).resolve().parents[1] / "helpers"
OUTCOMES = ("equal", "as written", "refused", "other")


@dataclass
class Run:
    """One format's mutations, over as many children as it took."""

    fmt: str
    files: int
    ends: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Each mutation's outcome, by its number (file * MUTATIONS + mutation)."""
    deaths: list[str] = field(default_factory=list)
    """How each child that did not finish ended, with its last words."""
    broken: str | None = None
    """Why the run could not go on (an undamaged file misread: the harness's own check)."""
    seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        found = Counter(end["outcome"] for end in self.ends.values())
        return {o: found.get(o, 0) for o in OUTCOMES}

    def cases(self, kind: str) -> list[dict[str, Any]]:
        """The mutations whose outcome was ``kind``, in order."""
        return [e for _, e in sorted(self.ends.items()) if e["outcome"] == kind]


def _lines(text: str | bytes | None) -> Iterator[dict[str, Any]]:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for line in (text or "").splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except ValueError:  # a line cut by the child's end
                continue


def _tail(text: str | bytes | None, lines: int = 25) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return "\n".join((text or "").splitlines()[-lines:])


def run_format(fmt: str, work: Path, files: int) -> Run:
    """``fmt``'s ``files`` x ``MUTATIONS`` mutations in child processes: one, and one more
    after each mutation that ended a child."""
    run = Run(fmt, files)
    total = files * fuzz_fns.MUTATIONS
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONHASHSEED": "0"}  # runs alike
    began = time.perf_counter()
    start = 0
    while start < total:
        argv = [sys.executable, "-X", "faulthandler", str(HELPERS / "fuzz_fns.py"), fmt, str(work),
                str(files), str(start)]  # fmt: skip
        limit = CHILD_S + 2 * (total - start)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=limit, env=env)
            out, err, how = done.stdout, done.stderr, _returned(done.returncode)
        except subprocess.TimeoutExpired as expired:
            out, err, how = expired.stdout, expired.stderr, f"still running after {limit} s"
        started: dict[int, dict[str, Any]] = {}
        finished = False
        for line in _lines(out):
            if line["event"] == "start":
                started[line["t"]] = line
            elif line["event"] == "end":
                run.ends[line["t"]] = line
            elif line["event"] == "broken":
                run.broken = f"file {line['file']} undamaged: {line['detail']}"
            elif line["event"] == "done":
                finished = True
        if finished and how == "exited 0":
            break
        if run.broken is not None:
            break
        dead = [t for t in started if t not in run.ends]
        if not dead:  # ended before its first mutation: nothing to step over
            run.broken = f"the child {how} before a mutation:\n{_tail(err)}"
            break
        t = dead[0]
        if isinstance(err, bytes):
            err = err.decode("utf-8", "replace")
        last = _tail((err or "").rsplit(fuzz_fns.MARK, 1)[-1].partition("\n")[2])
        detail = f"the child {how} (a crash, or a hang in C): {_first_line(last)}"
        run.ends[t] = {**started[t], "event": "end", "outcome": "other", "detail": detail}
        run.deaths.append(f"mutation {t} ({started[t]['what']}): the child {how}:\n{last}")
        start = t + 1
    run.seconds = time.perf_counter() - began
    return run


def _returned(code: int) -> str:
    if code < 0:
        return f"died of signal {code}"
    return f"exited {code}"


def _first_line(text: str) -> str:
    """The first telling line of a child's last words (faulthandler's, or a traceback's)."""
    for line in text.splitlines():
        if line.startswith(("Fatal Python error", "Timeout", "Segmentation", "Aborted")):
            return line.strip()
    return (text.splitlines() or [""])[-1].strip()


def cause(detail: str) -> str:
    """A case's cause: its line with paths, addresses and numbers (not those of names such
    as ``int32``) made general."""
    text = re.sub(r"(?<![\w.])(/[\w.@+-]+)+", "<path>", detail)
    text = re.sub(r"\b0x[0-9a-f]+\b", "<address>", text)
    text = re.sub(r"(?<![A-Za-z])\d+", "N", text)
    return text[:200]


def table(run: Run) -> str:
    """The counts in a line, then the *other* and *as written* cases grouped by cause
    (each cause's count and first case), then the ends of dead children."""
    counts = run.counts()
    total = run.files * fuzz_fns.MUTATIONS
    head = (
        f"fuzz {run.fmt}: {run.files} files x {fuzz_fns.MUTATIONS} mutations in "
        f"{run.seconds:.1f} s: " + ", ".join(f"{o} {counts[o]}" for o in OUTCOMES)
    )
    if sum(counts.values()) != total:
        head += f" (of {total}: {total - sum(counts.values())} not run)"
    lines = [head]
    if run.broken is not None:
        lines.append(f"  the harness stopped: {run.broken}")
    for kind in ("other", "as written"):
        groups: dict[str, list[dict[str, Any]]] = {}
        for end in run.cases(kind):
            groups.setdefault(cause(end["detail"]), []).append(end)
        if groups:
            lines.append(f"  {kind}, by cause:")
        for key, cases in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            first = cases[0]
            lines.append(f"  {len(cases):4d} x {key}")
            lines.append(
                f"         e.g. file {first['file']} mutation {first['mutation']} "
                f"({first['what']}): {first['detail'][:300]}"
            )
    lines += [f"  child: {d}" for d in run.deaths]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The children of every format this session selected, two at a time (a core each)."""
    test = test_a_damaged_file_is_read_as_its_peer_reads_it.__name__
    wanted = [
        getattr(item, "callspec").params["fmt"]  # noqa: B009  (pytest's Function, not Item)
        for item in request.session.items
        if getattr(item, "originalname", None) == test and hasattr(item, "callspec")
    ] or list(fuzz_fns.FORMATS)
    pool = ThreadPoolExecutor(max_workers=max(1, min(len(wanted), os.cpu_count() or 1)))
    futures: dict[str, Future[Run]] = {
        fmt: pool.submit(run_format, fmt, tmp_path_factory.mktemp(f"fuzz-{fmt}"), FILES)
        for fmt in wanted
    }
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("fmt", fuzz_fns.FORMATS)
def test_a_damaged_file_is_read_as_its_peer_reads_it(
    fmt: str, runs: dict[str, Future[Run]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Every damaged copy reads equal (or as written) or is refused by name: no other
    rows, no unnamed error, no hang, no crash (the rules: ``fuzz_fns``)."""
    future = runs.get(fmt)
    run = future.result() if future is not None else run_format(fmt, tmp_path, FILES)
    report = table(run)
    with capsys.disabled():  # the figures in every log, passed or failed
        sys.stderr.write("\n" + report)
    counts = run.counts()
    assert run.broken is None, report
    assert not run.deaths, report
    assert sum(counts.values()) == run.files * fuzz_fns.MUTATIONS, report
    assert counts["other"] == 0, report
