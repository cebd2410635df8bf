"""Liveness: which acked tasks are not finished yet, asked again and again of a growing history.

The world runs its liveness phase until every acked task has finished (or gives up, and the
verdict reports them lost: invariant 1, `sim.check.delivery`). It asks after every second of
that phase, so `LivenessWatch` parses only what the history grew by since it last looked and
re-judges only the acks that can have become satisfied; `LivenessWatch.check` then gives the
verdict on the whole history without parsing it again. `unfinished` asks it once.
"""

from __future__ import annotations

from sim.check.delivery import is_satisfied, unfinished_tasks
from sim.check.history import Ack, Analysis, History, HistoryError, analyse, start_analysis
from sim.check.report import Report
from sim.check.verdict import judge

__all__ = ["LivenessWatch", "unfinished"]


def unfinished(history: History) -> list[str]:
    """Acked tasks (deduplicated ones included) not finished yet, in ack order: the world runs
    its liveness phase until this is empty (or gives up, and `check` reports them lost). To ask
    again and again of one growing history, use a `LivenessWatch`."""
    return unfinished_tasks(analyse(history))


class LivenessWatch:
    """`unfinished` for a history that keeps growing: each call parses only the entries
    appended since the last one and re-judges only the acks still open whose task has a new
    record or whose fingerprint finished since (a finished task stays finished: acceptance is
    decided once), so polling during the liveness phase stays cheap."""

    __slots__ = ("_acks_seen", "_analysis", "_by_fingerprint", "_by_task", "_open", "_tasks")

    def __init__(self) -> None:
        self._analysis: Analysis | None = None
        #: The open acks by history index, in ack order.
        self._open: dict[int, Ack] = {}
        #: The open acks of each task and each fingerprint (closed ones are dropped lazily).
        self._by_task: dict[str, list[Ack]] = {}
        self._by_fingerprint: dict[str, list[Ack]] = {}
        self._acks_seen = 0
        #: The task ids of `_open`, in order, once each (None: to be listed again).
        self._tasks: list[str] | None = []

    def unfinished(self, history: History) -> list[str]:
        """As the module's `unfinished`; `history` must be the one seen before, grown."""
        self._follow(history)
        if self._tasks is None:
            self._tasks = list(dict.fromkeys([ack.task for ack in self._open.values()]))
        return list(self._tasks)

    def any_unfinished(self, history: History) -> bool:
        """Whether `unfinished(history)` is not empty, without listing the tasks."""
        self._follow(history)
        return bool(self._open)

    def _follow(self, history: History) -> None:
        """Parse what `history` grew by and re-judge the open acks it can have satisfied."""
        if self._analysis is None:
            self._analysis = start_analysis(history)
        elif len(history) < self._analysis.fed:
            raise HistoryError("a LivenessWatch follows one history, which never shrinks")
        a = self._analysis
        a.feed(history)
        # An open ack can only have become satisfied through a record of its task or its
        # fingerprint finishing (`satisfied` reads nothing else that changes): re-judge those.
        tasks, fingerprints = a.touched_tasks, a.touched_fingerprints
        if tasks or fingerprints:
            self._rejudge(a, self._by_task, tasks)
            self._rejudge(a, self._by_fingerprint, fingerprints)
            tasks.clear()
            fingerprints.clear()
        if self._acks_seen < len(a.acks):
            for ack in a.acks[self._acks_seen :]:
                if is_satisfied(a, ack):
                    continue
                self._open[ack.index] = ack
                self._by_task.setdefault(ack.task, []).append(ack)
                if ack.invoke.fingerprint is not None:
                    self._by_fingerprint.setdefault(ack.invoke.fingerprint, []).append(ack)
                self._tasks = None
            self._acks_seen = len(a.acks)

    def _rejudge(self, a: Analysis, index: dict[str, list[Ack]], keys: set[str]) -> None:
        """Close the open acks listed in `index` under `keys` that are satisfied now."""
        open_ = self._open
        for key in keys:
            listed = index.get(key)
            if listed is None:
                continue
            still = []
            for ack in listed:
                if ack.index not in open_:
                    continue  # closed through its task or its fingerprint already
                if is_satisfied(a, ack):
                    del open_[ack.index]
                    self._tasks = None
                else:
                    still.append(ack)
            if still:
                index[key] = still
            else:
                del index[key]

    def check(self, history: History) -> Report:
        """`check(history)`, reusing what was parsed already (the same verdict)."""
        self.unfinished(history)
        assert self._analysis is not None
        return judge(self._analysis)
