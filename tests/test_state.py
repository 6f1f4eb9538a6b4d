"""The run store, the per-file lock and the shared SQLite ledger."""

from __future__ import annotations

import contextlib
import multiprocessing
import sqlite3
import stat
import subprocess
import sys

import pytest

from batchrun.core.errors import JobsFileError, RunLocked, StateError
from batchrun.core.events import Status
from batchrun.core.identity import client_fingerprint
from batchrun.core.limits import LimitKey, Pace, parse_rule
from batchrun.jobs.endpoints import JobType, Method
from batchrun.jobs.job import Job, scan
from batchrun.jobs.jobfile import Problem
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.slots import Grant, Wait
from batchrun.run.journal import Journal
from batchrun.store import runlock
from batchrun.store.paths import StatePaths
from batchrun.store.results import JobResult, ResultsFile
from batchrun.store.runlock import RunLock, is_held
from batchrun.store.state import RunStore, check_jobs_file

RQ = LimitKey.RUN_QUERY


def q(job_id, line, payload=None):
    return Job(job_id, JobType.RUN_QUERY, "t", payload or {}, line)


def invite(job_id, line):
    return Job(job_id, JobType.INVITE, "t", {}, line)


def states(store):
    return {(k.value, s.value): n for (k, s), n in store.counts().items()}


def done(job):
    return JobResult(job.id, job.type.value, Status.DONE, 1, 200)


@pytest.fixture
def store():
    with RunStore(":memory:") as s:
        yield s


def test_sync_queues_every_row_as_pending(store):
    """A new file's rows all start pending, in file order."""
    store.sync([q("a", 2), q("b", 3)], path="f", restart=False)
    assert [j.id for j in store.pending(RQ)] == ["a", "b"]


def test_bad_rows_refuse_the_file_and_change_nothing(store):
    """Any Problem refuses the whole file (exit 2) and leaves the store as it was."""
    store.sync([q("a", 2)], path="f", restart=False)
    with pytest.raises(JobsFileError) as info:
        store.sync([q("b", 2), Problem(3, "bad type")], path="f", restart=False)
    assert info.value.problems == [(3, "bad type")]
    assert [j.id for j in store.pending(RQ)] == ["a"]


def test_rerun_skips_done_jobs_and_queues_new_rows(store):
    """Done jobs stay done on a rerun; rows added since are queued."""
    store.sync([q("a", 2), q("b", 3)], path="f", restart=False)
    store.finished(done(q("a", 2)))
    store.sync([q("a", 2), q("b", 3), q("c", 4)], path="f", restart=False)
    assert [j.id for j in store.pending(RQ)] == ["b", "c"]


def test_changed_done_row_is_refused(store):
    """A done job whose row changed is refused, naming the line and --restart."""
    store.sync([q("a", 2)], path="f", restart=False)
    store.finished(done(q("a", 2)))
    with pytest.raises(JobsFileError) as info:
        store.sync([q("a", 5, {"new": 1})], path="f", restart=False)
    [(line, reason)] = info.value.problems
    assert line == 5
    assert "'a' is done" in reason
    assert "--restart" in reason


def test_restart_forgets_earlier_runs(store):
    """--restart starts the file over: done jobs are pending again."""
    store.sync([q("a", 2)], path="f", restart=False)
    store.finished(done(q("a", 2)))
    store.sync([q("a", 2, {"new": 1})], path="f", restart=True)
    assert [j.payload for j in store.pending(RQ)] == [{"new": 1}]


def test_changed_pending_row_takes_the_new_content(store):
    """A job not yet sent simply takes the row's new content."""
    store.sync([q("a", 2)], path="f", restart=False)
    store.sync([q("a", 2, {"v": 2})], path="f", restart=False)
    assert [j.payload for j in store.pending(RQ)] == [{"v": 2}]


def test_recover_resends_safe_jobs_and_leaves_invites_unknown(store):
    """In flight at a crash: run-query goes back to pending, an invite to unknown."""
    store.sync([q("a", 2), invite("i", 3)], path="f", restart=False)
    store.started(q("a", 2), 1)
    store.started(invite("i", 3), 1)
    store.recover(retry_failed=False, retry_unknown=False)
    assert states(store) == {("run-query", "pending"): 1, ("invite", "unknown"): 1}
    store.recover(retry_failed=False, retry_unknown=True)
    assert states(store) == {("run-query", "pending"): 1, ("invite", "pending"): 1}


def test_failed_jobs_retry_only_when_asked(store):
    """Failed jobs stay failed unless --retry-failed."""
    store.sync([q("a", 2)], path="f", restart=False)
    store.finished(JobResult("a", "run-query", Status.FAILED, 1, 404, error="HTTP 404"))
    store.recover(retry_failed=False, retry_unknown=False)
    assert [f.error for f in store.failures()] == ["HTTP 404"]
    store.recover(retry_failed=True, retry_unknown=False)
    assert [j.id for j in store.pending(RQ)] == ["a"]


def test_invite_requeued_after_a_5xx_stays_in_flight(store):
    """An invite that got a 5xx may have been processed: a crash leaves it unknown."""
    store.sync([invite("i", 2)], path="f", restart=False)
    store.started(invite("i", 2), 1)
    store.requeued(invite("i", 2), maybe_processed=True)
    assert states(store) == {("invite", "in_flight"): 1}
    store.requeued(invite("i", 2), maybe_processed=False)
    assert states(store) == {("invite", "pending"): 1}


def test_pending_pages_through_many_jobs(store):
    """Pending jobs stream in pages, all of them, in order."""
    store.sync([q(f"j{i}", i + 2) for i in range(1203)], path="f", restart=False)
    ids = [j.id for j in store.pending(RQ)]
    assert ids == [f"j{i}" for i in range(1203)]


def test_state_folder_is_private(tmp_path):
    """State folders are 0700 and stores 0600."""
    paths = StatePaths(tmp_path / "s").made()
    db = paths.run_store(tmp_path / "jobs.csv", "c1")
    RunStore(db).close()
    for folder in (paths.root, paths.root / "runs", db.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_fingerprint_never_holds_the_token():
    """The client fingerprint depends on the token but does not contain it."""
    a = client_fingerprint("https://api", "sekrit-token")
    assert "sekrit" not in a
    assert a != client_fingerprint("https://api", "other")
    assert a == client_fingerprint("https://api/", "sekrit-token")


def _hold_lock(folder, ready, release):
    with RunLock(folder, folder / "jobs.csv"):
        ready.set()
        release.wait(10)


@contextlib.contextmanager
def lock_holder(folder):
    """Another process holding the lock of `folder` until the block ends (or it
    is killed); yields the process."""
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(folder, ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        yield holder
    finally:
        # Not after a kill: the dead process may hold the event's lock.
        if holder.is_alive():
            release.set()
        holder.join(10)


def test_second_run_of_a_file_is_locked_out_naming_the_holder(tmp_path):
    """While one process holds the file, another gets RunLocked naming its pid."""
    with lock_holder(tmp_path) as holder:
        with pytest.raises(RunLocked) as info, RunLock(tmp_path, tmp_path / "jobs.csv"):
            pass
        assert f"pid {holder.pid}" in info.value.message
        assert info.value.exit_code == 3


def test_lock_of_a_dead_process_does_not_block(tmp_path):
    """A lock file left by a killed process does not stop the next run."""
    with lock_holder(tmp_path) as holder:
        holder.kill()
        holder.join(10)
    assert (tmp_path / "lock").exists()
    with RunLock(tmp_path, tmp_path / "jobs.csv"):
        pass


def test_a_held_lock_is_seen_with_or_without_proc_locks(tmp_path, monkeypatch):
    """`status` sees a run's lock while its process holds it: in /proc/locks on
    Linux, by a probe elsewhere; and neither way once it is gone."""
    with RunLock(tmp_path, tmp_path / "jobs.csv"):
        pass
    assert not is_held(tmp_path)
    with lock_holder(tmp_path):
        assert is_held(tmp_path)
        monkeypatch.setattr(runlock, "_PROC_LOCKS", tmp_path / "no-proc-locks")
        assert is_held(tmp_path)
    assert not is_held(tmp_path)
    monkeypatch.undo()
    assert not is_held(tmp_path)


def ledger(tmp_path, now, client="c", hold=30.0):
    return SqliteLedger(
        tmp_path / "ledger.db", client=client, hold=hold, now=lambda: now
    )


def test_sqlite_ledger_shares_one_budget_between_connections(tmp_path):
    """Two ledgers on one file (two processes) share a client's windows; an answer
    reaches the other process when its ledger next writes (until then the request
    counts as in flight there, which is stricter)."""
    rule = parse_rule("2/10s")
    a, b = ledger(tmp_path, 0.0), ledger(tmp_path, 0.0)
    first = a.reserve("run-query", rule, Pace.EXACT, 0.0)
    assert isinstance(first, Grant)
    a.release(first.ticket, 0.5)
    assert isinstance(b.reserve("run-query", rule, Pace.EXACT, 1.0), Grant)
    # Both requests in flight, as b sees it: the next slot waits on the soonest
    # expiry (a's request, sent at 0 s with a 30 s timeout).
    assert b.reserve("run-query", rule, Pace.EXACT, 2.0) == Wait(30.0)
    # a's reserve writes its answer (0.5 s) first: b's request is in flight, so the
    # next slot is 10.5 s, as both connections see it.
    assert a.reserve("run-query", rule, Pace.EXACT, 2.0) == Wait(10.5)
    assert b.reserve("run-query", rule, Pace.EXACT, 2.0) == Wait(10.5)


def test_sqlite_ledger_separates_clients(tmp_path):
    """Another client (base URL + token) has its own budget."""
    rule = parse_rule("1/10s")
    assert isinstance(
        ledger(tmp_path, 0.0, "c1").reserve("k", rule, Pace.EXACT, 0.0), Grant
    )
    assert isinstance(
        ledger(tmp_path, 0.0, "c2").reserve("k", rule, Pace.EXACT, 0.0), Grant
    )
    assert isinstance(
        ledger(tmp_path, 0.0, "c1").reserve("k", rule, Pace.EXACT, 0.0), Wait
    )


def test_request_of_a_dead_process_counts_until_its_timeout(tmp_path):
    """An unanswered request holds the window until start + timeout, then ends there."""
    rule = parse_rule("1/10s")
    dead = ledger(tmp_path, 0.0, hold=30.0)
    assert isinstance(dead.reserve("k", rule, Pace.EXACT, 0.0), Grant)
    fresh = ledger(tmp_path, 5.0)
    assert fresh.reserve("k", rule, Pace.EXACT, 5.0) == Wait(30.0)
    assert fresh.reserve("k", rule, Pace.EXACT, 35.0) == Wait(40.0)
    assert isinstance(fresh.reserve("k", rule, Pace.EXACT, 40.0), Grant)


def test_duplicate_ids_are_found_by_the_store(store):
    """The store names duplicate ids itself, with the line each was first on."""
    rows = [q("a", 2), q("b", 3), q("a", 4), q("a", 6)]
    with pytest.raises(JobsFileError) as info:
        store.sync(rows, path="f", restart=False)
    assert info.value.problems == [
        (4, "duplicate id 'a' (first on line 2)"),
        (6, "duplicate id 'a' (first on line 2)"),
    ]
    assert info.value.total == 2


def _peak_while_taking_in(tmp_path, rows):
    import tracemalloc

    path = tmp_path / f"jobs{rows}.csv"
    with path.open("w") as out:
        out.write("id,type,team_id,payload\n")
        for i in range(rows):
            out.write(f'job-{i:07d},run-query,team{i % 50},"{{""q"": {i}}}"\n')
    with RunStore(tmp_path / f"run{rows}.db") as store:
        tracemalloc.start()
        store.sync(scan(path, check_duplicates=False), path=str(path), restart=False)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert sum(1 for _ in store.pending(RQ)) == rows
    return peak


def test_taking_in_a_file_streams_with_flat_memory(tmp_path):
    """Five times the rows take no more Python memory to validate and queue."""
    small = _peak_while_taking_in(tmp_path, 5_000)
    large = _peak_while_taking_in(tmp_path, 25_000)
    assert large < small * 1.5 + 256 * 1024, (small, large)


def _peak_while_validating(tmp_path, rows):
    import tracemalloc

    path = tmp_path / f"jobs{rows}.csv"
    with path.open("w") as out:
        out.write("id,type,team_id,payload\n")
        for i in range(rows):
            out.write(f"job-{i:07d},run-query,team{i % 50},\n")
    tracemalloc.start()
    summary = check_jobs_file(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert summary.total == rows
    assert summary.per_team["team7"] == rows // 50
    return peak


def test_validate_finds_duplicates_with_flat_memory(tmp_path):
    """validate checks ids in SQLite as submit does: five times the rows take no
    more Python memory (a set of every id grew with the file)."""
    small = _peak_while_validating(tmp_path, 5_000)
    large = _peak_while_validating(tmp_path, 25_000)
    assert large < small * 1.5 + 256 * 1024, (small, large)


def test_validate_names_duplicates_and_keeps_nothing(tmp_path):
    """validate names a duplicate id after a bad row that claimed it, and leaves
    no file behind."""
    path = tmp_path / "jobs.csv"
    path.write_text("id,type,team_id,payload\na,fax,t,\nb,run-query,t,\na,invite,t,\n")
    with pytest.raises(JobsFileError) as info:
        check_jobs_file(path)
    assert info.value.problems == [
        (2, "unknown type 'fax' (expected run-query, invite, avatar or request)"),
        (4, "duplicate id 'a' (first on line 2)"),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.csv"]


def test_store_from_a_newer_batchrun_is_refused_with_exit_74(tmp_path):
    """A run store whose schema version is newer than this build's is not touched."""
    path = tmp_path / "run.db"
    RunStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StateError, match="newer batchrun") as info:
        RunStore(path)
    assert info.value.exit_code == 74


def test_store_records_its_schema_version(tmp_path):
    """A new store carries the version of the schema it was made with."""
    path = tmp_path / "run.db"
    RunStore(path).close()
    with sqlite3.connect(path) as db:
        (version,) = db.execute("PRAGMA user_version").fetchone()
    assert version == 2


def test_rows_removed_from_the_file_are_not_sent(store):
    """A pending job whose row was deleted from the file leaves the queue."""
    store.sync([q("a", 2), q("b", 3), q("c", 4)], path="f", restart=False)
    store.sync([q("a", 2), q("c", 3)], path="f", restart=False)
    assert [j.id for j in store.pending(RQ)] == ["a", "c"]


@pytest.mark.parametrize("state", [Status.DONE, Status.FAILED, Status.UNKNOWN])
def test_a_changed_team_of_an_ended_job_is_noticed(store, state):
    """A done, failed or unknown job whose team_id changed is refused: it would
    be a different request under the same id."""
    store.sync([invite("i", 2)], path="f", restart=False)
    store.finished(JobResult("i", "invite", state, 1, None))
    moved = Job("i", JobType.INVITE, "other-team", {}, 2)
    with pytest.raises(JobsFileError) as info:
        store.sync([moved], path="f", restart=False)
    [(line, reason)] = info.value.problems
    assert line == 2
    assert reason.startswith(f"job 'i' is {state.value} from an earlier run")


def test_the_result_line_is_written_before_the_state(tmp_path, store):
    """A crash between the two can only repeat a result line, never lose one: the
    line is in the file before the store says the job ended."""
    store.sync([q("a", 2)], path="f", restart=False)
    results = ResultsFile(tmp_path / "r.jsonl")
    journal = Journal(store, results)
    seen_in_file = []
    real = store.finished

    def finished(result):
        seen_in_file.append((tmp_path / "r.jsonl").read_text().count('"a"'))
        real(result)

    store.finished = finished
    journal.finished(done(q("a", 2)))
    results.__exit__(None, None, None)
    assert seen_in_file == [1]
    assert states(store) == {("run-query", "done"): 1}


def test_the_journal_tells_the_store_a_requeue_may_have_been_processed(tmp_path, store):
    """The journal passes "may have been processed" on: such an invite stays in
    flight, so a crash before its retry leaves it unknown, not resent."""
    store.sync([invite("i", 2), invite("j", 3)], path="f", restart=False)
    with ResultsFile(tmp_path / "r.jsonl") as results:
        journal = Journal(store, results)
        for job, maybe in ((invite("i", 2), True), (invite("j", 3), False)):
            journal.started(job, 1)
            journal.requeued(job, maybe_processed=maybe)
    store.recover(retry_failed=False, retry_unknown=False)
    assert states(store) == {("invite", "unknown"): 1, ("invite", "pending"): 1}


# `request` jobs (issue 37)


def request(job_id, line, method, path, team="t"):
    return Job(job_id, JobType.REQUEST, team, {}, line, Method(method), path)


def test_request_jobs_come_back_with_their_method_path_and_budget(store):
    """A request job is stored and read back whole, queued under its budget."""
    jobs = [
        request("g", 2, "GET", "/teams/{team_id}/reports?day=1"),
        request("r", 3, "POST", "/teams/{team_id}/data/run-query"),
    ]
    store.sync(jobs, path="f", restart=False)
    [back] = store.pending(LimitKey.GLOBAL)
    assert (back.method, back.target, back.path) == (
        Method.GET,
        "/teams/{team_id}/reports?day=1",
        "/teams/t/reports?day=1",
    )
    assert [j.id for j in store.pending(RQ)] == ["r"]


def test_recover_leaves_post_and_patch_requests_unknown(store):
    """In flight when a run died: GET, PUT, DELETE are resent; POST, PATCH unknown."""
    jobs = [
        request(m.lower(), n, m, "/x")
        for n, m in enumerate(("GET", "PUT", "DELETE", "POST", "PATCH"), start=2)
    ]
    store.sync(jobs, path="f", restart=False)
    for job in jobs:
        store.started(job, 1)
    store.recover(retry_failed=False, retry_unknown=False)
    assert states(store) == {("global", "pending"): 3, ("global", "unknown"): 2}
    assert store.ids_in([Status.UNKNOWN]) == {"post", "patch"}


def test_a_changed_path_of_a_done_request_is_noticed(store):
    """A done request whose path changed is refused: another request, same id."""
    store.sync([request("g", 2, "GET", "/a")], path="f", restart=False)
    store.finished(JobResult("g", "request", Status.DONE, 1, 200))
    with pytest.raises(JobsFileError) as info:
        store.sync([request("g", 2, "GET", "/b")], path="f", restart=False)
    [(line, reason)] = info.value.problems
    assert (line, reason.startswith("job 'g' is done from an earlier run")) == (2, True)


def test_a_store_of_schema_1_keeps_invites_unsafe(tmp_path):
    """A store written before request jobs is brought up to date: an invite left
    in flight there still becomes unknown, a run-query is resent."""
    path = tmp_path / "run.db"
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, line INTEGER NOT NULL, "
            "type TEXT NOT NULL, key TEXT NOT NULL, team_id TEXT, payload TEXT NOT "
            "NULL, digest TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT "
            "NULL DEFAULT 0, http_status INTEGER, error TEXT);"
            "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "INSERT INTO jobs VALUES ('i', 2, 'invite', 'invite', 't', '{}', 'x', "
            "'in_flight', 1, NULL, NULL);"
            "INSERT INTO jobs VALUES ('q', 3, 'run-query', 'run-query', 't', '{}', "
            "'y', 'in_flight', 1, NULL, NULL);"
            "PRAGMA user_version = 1;"
        )
    with RunStore(path) as opened:
        opened.recover(retry_failed=False, retry_unknown=False)
        assert opened.ids_in([Status.UNKNOWN]) == {"i"}
        assert [j.id for j in opened.pending(RQ)] == ["q"]
    with sqlite3.connect(path) as db:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        marked = db.execute("SELECT id, unsafe, method FROM jobs ORDER BY id")
        assert (version, marked.fetchall()) == (2, [("i", 1, None), ("q", 0, None)])


def test_the_package_imports_without_fcntl():
    """Windows has no fcntl: every module of batchrun imports without it (the run
    lock is filelock's, which uses LockFileEx there)."""
    code = (
        "import sys; sys.modules['fcntl'] = None\n"
        "import importlib, pkgutil, batchrun\n"
        "for m in pkgutil.walk_packages(batchrun.__path__, 'batchrun.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
