"""The runner's recorder: the results file and the run store, kept in step.

A finished job's result line is written before its state, so a crash between the
two can only repeat a result line (readers take the last), never lose one.
"""

from __future__ import annotations

from batchrun.jobs.job import Job
from batchrun.store.results import JobResult, ResultsFile
from batchrun.store.state import RunStore


class Journal:
    """Records where each job stands in the run store, and each end in the
    results file first."""

    def __init__(self, store: RunStore, results: ResultsFile) -> None:
        self._store = store
        self._results = results

    def started(self, job: Job, attempt: int) -> None:
        self._store.started(job, attempt)

    def requeued(self, job: Job, *, maybe_processed: bool) -> None:
        self._store.requeued(job, maybe_processed=maybe_processed)

    def finished(self, result: JobResult) -> None:
        self._results.write(result)
        self._store.finished(result)
