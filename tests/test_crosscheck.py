"""The results file as the second record: on resume, jobs it ended are not sent
again whatever the run store says; lines of an earlier round never count."""

from __future__ import annotations

import json

from batchrun.cli.news import spoken
from batchrun.core.events import Status
from batchrun.core.limits import LimitKey
from batchrun.jobs.endpoints import JobType
from batchrun.jobs.job import Job
from batchrun.store import crosscheck
from batchrun.store.results import ResultsFile
from batchrun.store.state import RunStore

JOBS = [Job("a", JobType.RUN_QUERY, "t"), Job("b", JobType.INVITE, "t")]


def line(job_id, status, kind="run-query"):
    fields = {"id": job_id, "type": kind, "status": status, "attempts": 1}
    return json.dumps(fields | {"http_status": 200, "error": None}) + "\n"


def fresh_store(tmp_path):
    store = RunStore(tmp_path / "run.db")
    store.sync(JOBS, path="jobs.csv", restart=False)
    return store


def test_jobs_the_results_file_ended_are_not_sent_again(tmp_path):
    """Pending in the store, done or unknown after the store's offset in the
    results file: they take that state, and the message names the invite."""
    results = tmp_path / "r.jsonl"
    said: list[crosscheck.Recovered] = []
    with fresh_store(tmp_path) as store:
        crosscheck.reconcile(store, results, starting_over=False, say=said.append)
        results.write_text(line("a", "done") + line("b", "unknown", "invite"))
        crosscheck.reconcile(store, results, starting_over=False, say=said.append)
        assert store.ids_in([Status.PENDING]) == set()
        assert store.ids_in([Status.UNKNOWN]) == {"b"}
        assert list(store.pending(LimitKey.RUN_QUERY)) == []
    assert len(said) == 1
    assert "records 2 job(s), 1 of them invites" in spoken(said[0])
    assert "1 done, 1 unknown" in spoken(said[0])


def test_lines_before_a_new_round_never_count(tmp_path):
    """A run that starts over begins at the file's end: the earlier round's done
    lines leave its jobs pending."""
    results = tmp_path / "r.jsonl"
    results.write_text(line("a", "done") + line("b", "done", "invite"))
    said: list[crosscheck.Recovered] = []
    with fresh_store(tmp_path) as store:
        crosscheck.reconcile(store, results, starting_over=True, say=said.append)
        crosscheck.reconcile(store, results, starting_over=False, say=said.append)
        assert store.ids_in([Status.PENDING]) == {"a", "b"}
    assert said == []


def test_the_last_line_of_a_job_wins_and_ended_jobs_keep_their_state(tmp_path):
    """failed then done: done; a job the store already holds as failed stays."""
    results = tmp_path / "r.jsonl"
    with fresh_store(tmp_path) as store:
        crosscheck.reconcile(store, results, starting_over=False, say=print)
        store._db.execute("UPDATE jobs SET state = 'failed' WHERE id = 'b'")
        results.write_text(line("a", "failed") + line("a", "done") + line("b", "done"))
        crosscheck.reconcile(store, results, starting_over=False, say=print)
        assert store.ids_in([Status.DONE]) == {"a"}
        assert store.ids_in([Status.FAILED]) == {"b"}


def test_a_half_written_line_is_ended_before_the_next(tmp_path):
    """A run killed mid-write left half a line: the next run's first line is not
    glued to it, so it is read back."""
    results = tmp_path / "r.jsonl"
    results.write_text(line("a", "done")[:20])
    with fresh_store(tmp_path) as store:
        crosscheck.seen(store, results, 0)
        with ResultsFile(results) as file:
            file._file.write(line("b", "done", "invite"))
        crosscheck.reconcile(store, results, starting_over=False, say=print)
        assert store.ids_in([Status.DONE]) == {"b"}
