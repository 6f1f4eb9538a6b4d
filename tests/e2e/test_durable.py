"""Durable runs end to end: real `batchrun submit` processes against the sandbox.

Killed, stopped and overlapping runs over loopback, with every request the sandbox
saw counted. Windows are scaled down; timings leave room for a busy machine.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from batchrun.api.client import idempotency_key
from batchrun.cli.commands import app
from batchrun.core.limits import LimitKey, limit_table, parse_override
from batchrun.sandbox.app import create_app
from batchrun.sandbox.faults import Faults
from batchrun.sandbox.serving import running
from batchrun.store.paths import StatePaths
from batchrun.store.runlock import RunLock
from support.oracles import max_in_window

pytestmark = pytest.mark.e2e
LIMITS = ["run-query=20/1s", "invite=20/1s"]


def sandbox(faults=None, limits=LIMITS):
    rules = limit_table(overrides=[parse_override(x) for x in limits])
    return create_app(rules=rules, faults=faults)


def jobs_file(tmp_path, name="jobs.csv", queries=40, invites=10, prefix=""):
    rows = [f"{prefix}q{i},run-query,t," for i in range(queries)]
    rows += [f"{prefix}i{i},invite,t," for i in range(invites)]
    path = tmp_path / name
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def command(path, url, tmp_path, *extra, limits=LIMITS):
    args = [sys.executable, "-m", "batchrun", "submit", str(path), "--base-url", url]
    for rule in limits:
        args += ["--limit", rule]
    return [*args, "--state-dir", str(tmp_path / "state"), *extra]


def start(args):
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def results(path):
    lines = path.with_name(f"{path.stem}.results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def wait_for_results(path, count, seconds=20.0):
    target = path.with_name(f"{path.stem}.results.jsonl")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if target.exists() and len(target.read_text().splitlines()) >= count:
            return
        time.sleep(0.02)
    pytest.fail("the run produced no results in time")


def test_sigkill_mid_run_then_resume_loses_nothing(tmp_path):
    """Killed with SIGKILL mid-run and run again: every job ends done, only
    in-flight ones may repeat, in-flight invites become unknown and are not resent."""
    server = sandbox(Faults(rate_slow=0.5, slow_seconds=0.6, seed=5))
    path = jobs_file(tmp_path)
    key = {
        f"{t}{i}": idempotency_key(str(path.resolve()), f"{t}{i}")
        for t, n in (("q", 40), ("i", 10))
        for i in range(n)
    }
    with running(server) as url:
        first = start(command(path, url, tmp_path, "--concurrency", "16"))
        wait_for_results(path, 5)
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=10)
        again = subprocess.run(
            command(path, url, tmp_path), capture_output=True, timeout=60, check=False
        )
        before_retry = Counter(a.idempotency_key for a in server.state.sandbox.arrivals)
        unknown = set(key) - {r["id"] for r in results(path)}
        retried = subprocess.run(
            command(path, url, tmp_path, "--retry-unknown"),
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert again.returncode == (1 if unknown else 0), again.stderr
    assert retried.returncode == 0, retried.stderr
    assert all(job.startswith("i") for job in unknown)
    # No invite went out twice; only what was in flight at the kill repeats.
    assert all(before_retry[key[f"i{i}"]] <= 1 for i in range(10))
    assert sum(n > 1 for n in before_retry.values()) <= 16
    final = {line["id"]: line["status"] for line in results(path)}
    assert final == dict.fromkeys(key, "done")


def test_sigterm_stops_with_143_and_a_rerun_finishes(tmp_path):
    """SIGTERM: in-flight jobs finish, exit 143; the next run sends the rest, once."""
    server = sandbox(limits=["run-query=10/1s", "invite=10/1s"])
    path = jobs_file(tmp_path, queries=30, invites=0)
    limits = ["run-query=10/1s", "invite=10/1s"]
    with running(server) as url:
        first = start(command(path, url, tmp_path, limits=limits))
        wait_for_results(path, 10)
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=20)
        second = subprocess.run(
            command(path, url, tmp_path, limits=limits),
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert first.returncode == 143, err
    assert b"SIGTERM" in err
    assert second.returncode == 0
    arrivals = server.state.sandbox.arrivals
    accepted = Counter(a.idempotency_key for a in arrivals if a.status == 200)
    assert len(accepted) == 30
    twice = [
        (a.idempotency_key, a.status)
        for a in arrivals
        if accepted[a.idempotency_key] > 1
    ]
    assert set(accepted.values()) == {1}, twice
    # A 429 resends its job; only the arrival bound's own misjudgment on a loaded
    # machine can cause one here (seen once in CI, under the network-only bound
    # since replaced by the floor), at most two a process.
    assert sum(a.status == 429 for a in arrivals) <= 4


def test_deadline_stops_with_75(tmp_path):
    """--deadline stops starting requests and exits 75 with jobs left."""
    server = sandbox(limits=["run-query=5/1s"])
    path = jobs_file(tmp_path, queries=20, invites=0)
    with running(server) as url:
        done = subprocess.run(
            command(
                path, url, tmp_path, "--deadline", "1200ms", limits=["run-query=5/1s"]
            ),
            capture_output=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 75
    assert b"Deadline reached" in done.stderr
    assert 5 <= len(server.state.sandbox.arrivals) < 20


def test_sigint_stops_with_130(tmp_path):
    """Ctrl-C (SIGINT) mid-run: in-flight jobs finish, exit 130, so a loop stops."""
    limits = ["run-query=10/1s"]
    path = jobs_file(tmp_path, queries=30, invites=0)
    with running(sandbox(limits=limits)) as url:
        first = start(command(path, url, tmp_path, limits=limits))
        wait_for_results(path, 10)
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=20)
    assert first.returncode == 130, err
    assert err.count(b"Stopped early") == 1


def test_two_processes_of_one_client_share_one_budget(tmp_path):
    """Two processes with different jobs files, one client: combined, no window is
    exceeded. Apart (two budgets) about half of the 50 would be refused; shared,
    only the arrival bound's own misjudgment can cost a refusal (on a loaded
    machine the in-process server may take a request in later than the network's
    round trip says), and each process widens its bound after one."""
    limits = ["run-query=10/1s"]
    server = sandbox(limits=limits)
    a = jobs_file(tmp_path, "a.csv", queries=25, invites=0, prefix="a")
    b = jobs_file(tmp_path, "b.csv", queries=25, invites=0, prefix="b")
    with running(server) as url:
        runs = [start(command(p, url, tmp_path, limits=limits)) for p in (a, b)]
        errors = [run.communicate(timeout=60)[1] for run in runs]
    arrivals = server.state.sandbox.arrivals
    assert [run.returncode for run in runs] == [0, 0], errors
    statuses = Counter(x.status for x in arrivals)
    assert statuses[200] == 50
    assert statuses[429] <= 4, statuses
    accepted = max_in_window(
        server.state.sandbox, LimitKey.RUN_QUERY, 1.0, statuses={200}
    )
    assert accepted <= 10
    # Alone, each file's 25 jobs take 2 s; sharing 10/1s, the 50 take at least 4 s.
    span = max(x.at for x in arrivals) - min(x.at for x in arrivals)
    assert span >= 4.0


def test_locked_file_exits_3(tmp_path):
    """A second submit of a file another run holds exits 3 at once."""
    path = jobs_file(tmp_path, queries=1, invites=0)
    state = StatePaths(tmp_path / "state").made().sandbox()
    folder = state.make_run_folder(path)
    with RunLock(folder, path):
        result = CliRunner().invoke(
            app,
            ["submit", str(path), "--sandbox", "--state-dir", str(tmp_path / "state")],
        )
    assert result.exit_code == 3
    assert "already working on" in result.stderr
