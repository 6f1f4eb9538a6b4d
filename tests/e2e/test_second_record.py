"""End to end: the results file is the run's second record.

The issue's case, over loopback: the run store's -wal is deleted while a run uses
it, then the run is killed with SIGKILL, so the store falls back to its last
checkpoint. The rerun must not send again any job the results file lists as done
or unknown (invites above all), and says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest
from typer.testing import CliRunner

from batchrun.api.client import idempotency_key
from batchrun.cli.commands import app
from batchrun.core.limits import LimitKey
from batchrun.sandbox.serving import running
from tests.e2e.test_durable import command, jobs_file, sandbox, start, wait_for_results

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]
LIMITS = ["run-query=30/1s", "invite=15/1s"]
QUERIES, INVITES = 90, 30


# Checkpoints the store, then holds a read snapshot open: the run's own
# checkpoints cannot copy later writes into the file (as when a reader such as
# `status` holds it), so they stay in the -wal only, as between two checkpoints
# of a big run.
PIN = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA wal_checkpoint(PASSIVE)")
db.execute("BEGIN")
db.execute("SELECT count(*) FROM jobs").fetchall()
print("pinned", flush=True)
time.sleep(60)
"""


def pinned(store):
    """A process that checkpointed `store` and holds its snapshot (kill it)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", PIN, str(store)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "pinned"
    return holder


def last_lines(path):
    lines = path.with_name("jobs.results.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def test_a_store_that_lost_its_wal_resends_nothing_the_results_file_ended(tmp_path):
    """-wal deleted while in use, run killed: the rerun sends no job whose last
    result line is done or unknown, says so, and the unsent ones go once."""
    server = sandbox(limits=LIMITS)
    path = jobs_file(tmp_path, queries=QUERIES, invites=INVITES)
    with running(server) as url:
        run = start(command(path, url, tmp_path, limits=LIMITS))
        try:
            wait_for_results(path, 20)
            [store] = (tmp_path / "state" / "runs").glob("*/*.db")
            holder = pinned(store)
            wait_for_results(path, 60)
            # Frozen first, so that nothing it does comes between the two.
            os.kill(run.pid, signal.SIGSTOP)
            store.with_name(store.name + "-wal").unlink()
            os.kill(run.pid, signal.SIGKILL)
            # Killed too: closing would copy the deleted -wal into the file.
            holder.kill()
            holder.communicate()
        finally:
            run.kill()
            run.communicate()
        ended = {i for i, r in last_lines(path).items() if r["status"] != "failed"}
        before = Counter(a.idempotency_key for a in server.state.sandbox.arrivals)
        args = ["submit", str(path), "--base-url", url, "--state-dir"]
        args += [str(tmp_path / "state")]
        for rule in LIMITS:
            args += ["--limit", rule]
        rerun = CliRunner().invoke(app, args)
    assert rerun.exit_code in (0, 1), rerun.output
    arrivals = server.state.sandbox.arrivals
    after = Counter(a.idempotency_key for a in arrivals)
    again = after - before
    scope = str(path.resolve())
    assert not [i for i in ended if again[idempotency_key(scope, i)]]
    # Invites among them: each ended one reached the server once, in all. (One
    # in flight at the kill has no line, and the lost store no mark of it.)
    invites = Counter(a.idempotency_key for a in arrivals if a.key is LimitKey.INVITE)
    ended_invites = [idempotency_key(scope, i) for i in ended if i.startswith("i")]
    assert ended_invites
    assert {invites[key] for key in ended_invites} == {1}
    assert "records" in rerun.stderr
    assert "not sent again" in rerun.stderr
