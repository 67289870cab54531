"""Counts and seconds that several threads add to: ``Tally``.

Every stage of the pipeline keeps one (the source's reads, the record workers, the
placing, the consumer's waits) and ``loader.stats()`` reads them all. Counting is always
on, so an add must cost next to nothing: each thread adds to cells of its own (no lock,
no thread waits on another; ~0.3 us an add here) and a read sums every thread's cells.
A cell is written only by its thread, so the sums are exact. Stages add once per call
of theirs (a step, a chunk), never per record; ``updates`` counts the adds, so the cost
of counting can be set against what it counts (``benchmarks/stats.py``).
"""

from __future__ import annotations

import threading


class Tally:
    """Named amounts (counts or seconds), added to from any thread.

    ``add(a, b, ...)`` adds to the names in the order the tally was made with (the fast
    way, for every step); ``add(name=amount)`` by name (for what happens rarely).
    """

    def __init__(self, *names: str) -> None:
        self.names = names
        self._index = {name: i for i, name in enumerate(names)}
        self._mine = threading.local()
        self._lock = threading.Lock()  # guards the list of every thread's cells
        self._cells: list[tuple[threading.Thread, list[float]]] = []
        self._ended: list[float] = [0] * (len(names) + 1)  # threads gone, folded in

    def _new_cells(self) -> list[float]:
        cells: list[float] = [0] * (len(self.names) + 1)  # the last: the adds
        self._mine.cells = cells
        with self._lock:
            self._cells.append((threading.current_thread(), cells))
        return cells

    def add(self, *amounts: float, **named: float) -> None:
        """Adds each amount to its name: by position, then by name."""
        try:
            cells = self._mine.cells
        except AttributeError:
            cells = self._new_cells()
        i = 0  # a counter, not enumerate(): 0.1 us an add less (this runs every step)
        for amount in amounts:
            cells[i] += amount
            i += 1  # noqa: SIM113
        for name, amount in named.items():
            cells[self._index[name]] += amount
        cells[-1] += 1

    def _sums(self) -> list[float]:
        """Every thread's cells summed; the cells of threads that ended are folded into
        one list (a long run starts reader threads again at each restore)."""
        with self._lock:
            for thread, cells in [c for c in self._cells if not c[0].is_alive()]:
                self._ended = [a + b for a, b in zip(self._ended, cells, strict=True)]
                self._cells.remove((thread, cells))
            every = [self._ended, *(cells for _, cells in self._cells)]
        return [sum(cells[i] for cells in every) for i in range(len(self.names) + 1)]

    def values(self) -> dict[str, float]:
        """Every name's amount now, over all threads."""
        return dict(zip(self.names, self._sums()[:-1], strict=True))

    @property
    def updates(self) -> int:
        """How many ``add`` calls there were (the cost of counting is per call)."""
        return int(self._sums()[-1])


def since(now: dict[str, float], then: dict[str, float]) -> dict[str, float]:
    """``now`` minus ``then``, name by name (a name ``then`` lacks counts from zero)."""
    return {name: value - then.get(name, 0) for name, value in now.items()}
