"""The runner's recorder: the results file and the run store, kept in step.

A finished job's result line is written before its state, so a crash between the
two can only repeat a result line (readers take the last), never lose one. Every
`_MARK_EVERY` ends, and at the end of the run, the store records how much of the
results file it reflects, so a resume checks only the lines after that
(`store.crosscheck`).
"""

from __future__ import annotations

from batchrun.jobs.job import Job
from batchrun.store import crosscheck
from batchrun.store.results import JobResult, ResultsFile
from batchrun.store.state import RunStore

_MARK_EVERY = 1000


class Journal:
    """Records where each job stands in the run store, and each end in the
    results file first."""

    def __init__(self, store: RunStore, results: ResultsFile) -> None:
        self._store = store
        self._results = results
        self._ends = 0

    def started(self, job: Job, attempt: int) -> None:
        self._store.started(job, attempt)

    def requeued(self, job: Job, *, maybe_processed: bool) -> None:
        self._store.requeued(job, maybe_processed=maybe_processed)

    def finished(self, result: JobResult) -> None:
        self._results.write(result)
        self._store.finished(result)
        self._ends += 1
        if self._ends % _MARK_EVERY == 0:
            self.caught_up()

    def caught_up(self) -> None:
        """Record in the store that it reflects every result line written."""
        crosscheck.seen(self._store, self._results.path, self._results.tell())
