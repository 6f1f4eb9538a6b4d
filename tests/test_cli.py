"""The command line: every command, every exit code of the contract, no token shown."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.errors import StateError

runner = CliRunner()
TOKEN = "tok-3f9a-SECRET"
FAST = ["--sandbox", "--time-scale", "1000"]


def jobs_file(tmp_path, rows=("a,run-query,t1,", "b,invite,t1,", "c,avatar,,")):
    path = tmp_path / "jobs.csv"
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def results_of(tmp_path, *, sandbox=True):
    """The results of jobs.csv's run: a --sandbox run's, unless `sandbox` is off."""
    kind = ".sandbox" if sandbox else ""
    text = (tmp_path / f"jobs{kind}.results.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


# Every command the app has, so that a new one cannot miss its help or README entry.
COMMANDS = [
    c.name or c.callback.__name__ for c in app.registered_commands if c.callback
]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    """Each command explains itself with --help."""
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_is_in_the_readme(command):
    """The README names every command."""
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert f"`batchrun {command}" in readme


@pytest.mark.parametrize("command", [[], ["submit"], ["status"]])
def test_dash_h_is_help(command):
    """-h is --help, for the app and each command."""
    result = runner.invoke(app, [*command, "-h"])
    assert result.exit_code == 0
    assert "Usage" in result.stdout


def test_submit_help_groups_options_and_lists_exit_codes():
    """submit --help: options in panels, flags without a <bool> type, the exit
    codes (130, 143 and which wins) and every --inject fault."""
    text = " ".join(runner.invoke(app, ["submit", "--help"]).stdout.split())
    for panel in ("Where to send", "Limits", "Run control", "Output", "State"):
        assert f"─ {panel} ─" in text
    assert "--sandbox <bool>" not in text
    assert "--restart Forget" in text
    assert "130 Ctrl-C; 143 SIGTERM. A signal's code wins, then 69, then 1" in text
    assert "69 stopped early, every request failing the same way" in text
    assert "seed=7" in text


def test_version():
    """--version prints the version."""
    result = runner.invoke(app, ["--version"])
    assert result.stdout.startswith("batchrun 0.")


def test_validate_summarizes_a_good_file(tmp_path):
    """validate exits 0 and counts jobs per type and team."""
    result = runner.invoke(app, ["validate", str(jobs_file(tmp_path))])
    assert result.exit_code == 0
    assert "3 valid job(s): run-query 1, invite 1, avatar 1" in result.stdout
    assert "1 team(s): t1 2" in result.stdout


def test_validate_names_bad_rows_and_exits_2(tmp_path):
    """validate exits 2 and names each bad row on stderr."""
    path = jobs_file(tmp_path, ["a,fax,t1,", "a,avatar,,"])
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "line 2: unknown type 'fax'" in result.stderr
    # A bad row still claims its id, so both problems show at once.
    assert "line 3: duplicate id 'a'" in result.stderr
    assert "Traceback" not in result.stderr
    # validate never sends, so it does not say that nothing was.
    assert "sent" not in result.stderr


def test_validate_counts_with_thousands_separators(tmp_path):
    """validate's summary reads 1,200, as every count batchrun prints."""
    rows = [f"q{i},run-query,t{i % 2}," for i in range(1200)]
    result = runner.invoke(app, ["validate", str(jobs_file(tmp_path, rows))])
    assert result.exit_code == 0, result.stderr
    assert "1,200 valid job(s): run-query 1,200" in result.stdout
    assert "2 team(s): t0 600, t1 600" in result.stdout


def test_validate_of_an_unreadable_file_says_nothing_of_sending(tmp_path):
    """A file validate cannot read is named, with no word of sending."""
    result = runner.invoke(app, ["validate", str(tmp_path / "nope.csv")])
    assert result.exit_code == 2
    assert "nope.csv" in result.stderr
    assert "sent" not in result.stderr.lower()


def test_submit_of_a_bad_file_says_nothing_was_sent(tmp_path):
    """submit, which would send, says that nothing was."""
    path = jobs_file(tmp_path, ["a,fax,t1,"])
    result = runner.invoke(app, ["submit", str(path), "--sandbox"])
    assert result.exit_code == 2
    assert "nothing was sent" in result.stderr.lower()


def test_validate_json_of_a_good_file(tmp_path):
    """validate --json: one object with the counts per type and team."""
    path = jobs_file(tmp_path)
    result = runner.invoke(app, ["validate", str(path), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "file": str(path),
        "valid": True,
        "jobs": 3,
        "per_type": {"run-query": 1, "invite": 1, "avatar": 1},
        "per_budget": {
            "run-query": {"run-query": 1},
            "invite": {"invite": 1},
            "avatar": {"avatar": 1},
        },
        "per_team": {"t1": 2},
    }


def test_validate_json_of_a_bad_file_exits_2_with_every_problem(tmp_path):
    """validate --json of a bad file: exit 2, the problems by line on stdout."""
    path = jobs_file(tmp_path, ["a,fax,t1,", "a,avatar,,"])
    result = runner.invoke(app, ["validate", str(path), "--json"])
    assert result.exit_code == 2
    report = json.loads(result.stdout)
    assert (report["valid"], report["invalid_rows"]) == (False, 2)
    assert report["problems"] == [
        {
            "line": 2,
            "reason": "unknown type 'fax' (expected run-query, invite, avatar or request)",
        },
        {"line": 3, "reason": "duplicate id 'a' (first on line 2)"},
    ]


def test_submit_to_sandbox_sends_every_job_and_exits_0(tmp_path):
    """submit --sandbox ends every job done, writes results, exits 0."""
    path = jobs_file(tmp_path)
    result = runner.invoke(app, ["submit", str(path), *FAST])
    assert result.exit_code == 0, result.stderr
    assert {r["id"]: r["status"] for r in results_of(tmp_path)} == dict.fromkeys(
        "abc", "done"
    )
    assert "3 done, 0 failed, 0 left" in result.stdout


def test_restart_sends_again_what_a_results_file_ended_in_a_fresh_state_folder(
    tmp_path,
):
    """A new state folder (another machine, one emptied) finds the results file
    of an earlier run: its done jobs are not sent again unasked, and the
    message names --restart; --restart forgets that run, and every job goes."""
    path = jobs_file(tmp_path)

    def submit(folder, *more):
        state = ["--state-dir", str(tmp_path / folder)]
        return runner.invoke(app, ["submit", str(path), *FAST, *state, *more])

    assert submit("one").exit_code == 0
    kept = submit("two")
    assert kept.exit_code == 0
    assert "Nothing to send" in kept.stdout + kept.stderr
    assert "--restart forgets the run" in kept.stdout + kept.stderr
    again = submit("three", "--restart")
    assert again.exit_code == 0, again.stderr
    assert "3 done, 0 failed, 0 left" in again.stdout


def test_submit_refuses_a_bad_file_before_sending(tmp_path):
    """A bad row: exit 2, nothing sent, no results file."""
    path = jobs_file(tmp_path, ["a,avatar,,", "b,invite,,"])
    result = runner.invoke(app, ["submit", str(path), *FAST])
    assert result.exit_code == 2
    assert "line 3: team_id is missing" in result.stderr
    assert not list(tmp_path.glob("*.results.jsonl"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param([], "give --base-url", id="no-target"),
        pytest.param(["--base-url", "ftp://x"], "http:// or https://", id="bad-scheme"),
        pytest.param(
            ["--base-url", "https://u:p@api.test"],
            "must not hold credentials",
            id="credentials",
        ),
        pytest.param(
            ["--sandbox", "--limit", "run-query=fast"],
            "bad limit rule 'fast'",
            id="bad-rule",
        ),
        pytest.param(
            ["--sandbox", "--limit", "nokey=1/1s"], "unknown key 'nokey'", id="bad-key"
        ),
        pytest.param(
            ["--base-url", "https://api.test", "--inject", "429=0.1"],
            "--inject only works with --sandbox",
            id="inject-without-sandbox",
        ),
        pytest.param(["--sandbox", "--inject", "429=2"], "fault rates", id="bad-fault"),
        pytest.param(["--sandbox", "--time-scale", "0"], "time-scale", id="zero-scale"),
        pytest.param(
            ["--base-url", "https://api.test", "--server-limit", "run-query=1/1s"],
            "--server-limit only works with --sandbox",
            id="server-limit-without-sandbox",
        ),
        pytest.param(
            ["--base-url", "https://api.test", "--server-headers", "ietf"],
            "--server-headers only works with --sandbox",
            id="server-headers-without-sandbox",
        ),
        pytest.param(
            ["--base-url", "https://api.test", "--server-burst", "3"],
            "--server-burst only works with --sandbox",
            id="server-burst-without-sandbox",
        ),
        pytest.param(
            ["--sandbox", "--server-burst", "3"],
            "a burst needs leaky counting",
            id="burst-without-leaky",
        ),
        pytest.param(
            ["--sandbox", "--server-limit", "run-query=fast"],
            "bad --server-limit 'run-query=fast'",
            id="bad-server-limit",
        ),
        pytest.param(
            ["--sandbox", "--server-counting", "token-bucket"],
            "--server-counting must be sliding, fixed,",
            id="bad-server-counting",
        ),
        pytest.param(
            ["--sandbox", "--server-counting", "leaky", "--limit", "avatar=1/1h"],
            "cannot count leaky",
            id="too-slow-for-leaky",
        ),
        pytest.param(
            ["--base-url", "https://api.test", "--time-scale", "30"],
            "--time-scale 30 only works with --sandbox",
            id="time-scale-against-a-real-api",
        ),
    ],
)
def test_bad_usage_exits_2_with_a_message(tmp_path, args, message):
    """Bad flags get a clear message on stderr and exit 2, never a traceback."""
    result = runner.invoke(app, ["submit", str(jobs_file(tmp_path)), *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_typer_usage_errors_exit_2(tmp_path):
    """An unknown option or profile is a usage error, exit 2."""
    result = runner.invoke(app, ["submit", str(jobs_file(tmp_path)), "--profile", "c"])
    assert result.exit_code == 2


def test_failed_jobs_exit_1(tmp_path):
    """Jobs the server refuses with a 4xx fail, and submit exits 1."""
    from batchrun.core.limits import limit_table
    from batchrun.sandbox.app import create_app
    from batchrun.sandbox.serving import running

    with running(create_app(rules=limit_table())) as url:
        result = runner.invoke(
            app,
            ["submit", str(jobs_file(tmp_path)), "--base-url", url + "/wrong-prefix"],
        )
    assert result.exit_code == 1
    assert {r["http_status"] for r in results_of(tmp_path, sandbox=False)} == {404}


def test_a_request_the_server_refuses_with_405_fails_once(tmp_path):
    """A request with a method its endpoint lacks fails at its first 405, with
    the server's message, and submit exits 1."""
    from batchrun.core.limits import limit_table
    from batchrun.sandbox.app import create_app
    from batchrun.sandbox.serving import running

    path = tmp_path / "jobs.csv"
    path.write_text(
        "id,type,team_id,payload,method,path\n"
        "a,request,,,GET,/teams/t1/data/run-query\n"
        "b,request,,,DELETE,/users/me/avatar\n"
    )
    with running(create_app(rules=limit_table())) as url:
        result = runner.invoke(app, ["submit", str(path), "--base-url", url])
    assert result.exit_code == 1
    ended = results_of(tmp_path, sandbox=False)
    assert [(r["http_status"], r["attempts"]) for r in ended] == [(405, 1)] * 2
    assert ended[0]["error"] == (
        "HTTP 405 Method Not Allowed; no GET /teams/t1/data/run-query here"
    )


def test_token_is_never_shown(tmp_path):
    """The token appears in no output and not in the results file."""
    path = jobs_file(tmp_path)
    result = runner.invoke(app, ["submit", str(path), *FAST, "--token", TOKEN])
    assert result.exit_code == 0
    assert TOKEN not in result.stdout + result.stderr
    kept = (tmp_path / "jobs.sandbox.results.jsonl").read_bytes()
    assert TOKEN.encode() not in kept


def test_token_comes_from_the_environment(tmp_path):
    """BATCHRUN_TOKEN is sent as the bearer token."""
    from batchrun.core.limits import limit_table
    from batchrun.sandbox.app import create_app
    from batchrun.sandbox.serving import running

    server = create_app(rules=limit_table())
    with running(server) as url:
        result = runner.invoke(
            app,
            ["submit", str(jobs_file(tmp_path, ["a,avatar,,"]))],
            env={"BATCHRUN_TOKEN": TOKEN, "BATCHRUN_BASE_URL": url},
        )
    assert result.exit_code == 0, result.stderr
    [arrival] = server.state.sandbox.arrivals
    assert arrival.status == 200
    assert TOKEN not in arrival.client


@pytest.mark.parametrize(
    ("url", "warned"),
    [
        pytest.param("http://reporting.example.com", True, id="remote-http"),
        pytest.param("https://reporting.example.com", False, id="remote-https"),
        pytest.param("http://127.0.0.1:9", False, id="loopback-ip"),
        pytest.param("http://localhost:9", False, id="localhost"),
        pytest.param("http://[::1]:9", False, id="loopback-v6"),
    ],
)
def test_plain_http_to_a_remote_host_warns(url, warned):
    """http:// to a host that is not loopback warns that the token travels in clear."""
    from batchrun.cli.arguments import check_base_url

    said: list[str] = []
    check_base_url(url, said.append)
    assert any("plain http://" in line for line in said) is warned


@pytest.mark.parametrize(
    ("url", "token", "said"),
    [
        pytest.param(
            "http://reporting.example.com",
            None,
            "no token for reporting.example.com (BATCHRUN_TOKEN or --token): "
            "requests go over plain http:// without Authorization.",
            id="http-no-token",
        ),
        pytest.param(
            "http://reporting.example.com",
            TOKEN,
            "reporting.example.com is reached over plain http://: the token travels "
            "unencrypted. Use https://.",
            id="http-token",
        ),
        pytest.param(
            "https://reporting.example.com",
            None,
            "no token for reporting.example.com (BATCHRUN_TOKEN or --token): "
            "requests go without Authorization.",
            id="https-no-token",
        ),
    ],
)
def test_a_remote_url_gets_one_warning_set_apart_from_the_log(
    tmp_path, url, token, said
):
    """One warning line, not two that contradict (a token in clear, then no
    token); `warning:` first and no time or process, unlike the log's lines."""
    bad = tmp_path / "bad.csv"
    bad.write_text("id,type,team_id,payload\nx,nope,,\n")
    args = ["submit", str(bad), "--base-url", url]
    result = runner.invoke(app, [*args, *(["--token", token] if token else [])])
    assert result.exit_code == 2
    warnings = [ln for ln in result.stderr.splitlines() if "warning" in ln.lower()]
    assert warnings == [f"warning: {said}"]


def test_the_results_line_ends_the_summary_on_its_stream(tmp_path):
    """The summary and the `Results:` line go to one stream, the Results line last."""
    result = runner.invoke(app, ["submit", str(jobs_file(tmp_path)), *FAST])
    assert result.exit_code == 0, result.stderr
    last = result.stdout.splitlines()[-1]
    assert last.endswith(f"Results: {tmp_path / 'jobs.sandbox.results.jsonl'}")
    assert "Results:" not in result.stderr


def test_results_flag_chooses_the_file(tmp_path):
    """--results writes where it is told."""
    target = tmp_path / "out" / "r.jsonl"
    target.parent.mkdir()
    result = runner.invoke(
        app, ["submit", str(jobs_file(tmp_path)), *FAST, "--results", str(target)]
    )
    assert result.exit_code == 0
    assert len(target.read_text().splitlines()) == 3


def test_unwritable_results_file_is_a_usage_error(tmp_path):
    """A results path that cannot be written exits 2 with a hint."""
    result = runner.invoke(
        app,
        [
            "submit",
            str(jobs_file(tmp_path)),
            *FAST,
            "--results",
            str(tmp_path / "no" / "r.jsonl"),
        ],
    )
    assert result.exit_code == 2
    assert "cannot write results" in result.stderr


def test_sandbox_faults_show_as_requeued_429s(tmp_path):
    """Injected 429s are requeued and the jobs still end done."""
    rows = [f"q{i},run-query,t1," for i in range(20)]
    result = runner.invoke(
        app,
        [
            "submit",
            str(jobs_file(tmp_path, rows)),
            *FAST,
            "--inject",
            "429=0.3",
            "--inject",
            "seed=4",
        ],
    )
    assert result.exit_code == 0
    assert all(r["status"] == "done" for r in results_of(tmp_path))
    assert any(r["attempts"] > 1 for r in results_of(tmp_path))


@pytest.mark.parametrize(
    ("server", "learned"),
    [
        # A burst of 5 fits any window longer than it lasted: the fastest is
        # tried first (5/60ms, a tenth of the rule's), then a longer one for
        # each 429 that refutes it; 20 jobs end before 5/600ms, or at it.
        (["--server-limit", "run-query=5/1m"], r"now 5/\d+ms\+30/600ms|now 5/600ms"),
        (
            ["--server-counting", "leaky", "--server-burst", "4"],
            r"now (30/600ms, bursts of [3-5] |5/\d+ms\+30/600ms)",
        ),
    ],
    ids=["stricter", "leaky-burst"],
)
def test_a_stricter_sandbox_is_learned_from(tmp_path, server, learned):
    """--server-limit makes the sandbox stricter than the client's rule (or
    --server-counting leaky --server-burst 4 a bucket, read as 5 at once in
    a short window, or as a bucket at the rule's rate once that is refuted):
    the run says what it learned, and every job still ends done once."""
    rows = [f"q{i},run-query,t1," for i in range(20)]
    args = ["--time-scale", "100", "--limit", "run-query=30/1m", *server]
    result = runner.invoke(
        app, ["submit", str(jobs_file(tmp_path, rows)), *FAST[:1], *args]
    )
    assert result.exit_code == 0, result.stderr
    said = r"run-query: the server allows less than the rule; " + learned
    assert re.search(said, result.stdout), result.stdout
    assert sorted(r["id"] for r in results_of(tmp_path)) == sorted(
        f"q{i}" for i in range(20)
    )


def test_a_sandbox_stating_its_policy_costs_no_429(tmp_path):
    """With --server-headers ietf the client adopts the stated rule before any 429."""
    rows = [f"q{i},run-query,t1," for i in range(12)]
    args = ["--time-scale", "100", "--server-limit", "run-query=5/1m"]
    args += ["--server-headers", "ietf", "--concurrency", "1"]
    result = runner.invoke(
        app, ["submit", str(jobs_file(tmp_path, rows)), *FAST[:1], *args]
    )
    assert result.exit_code == 0, result.stderr
    assert "the server states 5/600ms in its rate-limit headers" in result.stdout
    assert all(r["attempts"] == 1 for r in results_of(tmp_path))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--counting", "token"], "--counting must be sliding,", id="counting"
        ),
        pytest.param(
            ["--headers", "x"], "--headers must be none, ietf, draft7", id="headers"
        ),
        pytest.param(
            ["--profile", "auto"], "--profile must be a or b, not 'auto'", id="auto"
        ),
        pytest.param(
            ["--counting", "leaky", "--limit", "invite=1/1h"],
            "cannot count leaky",
            id="too-slow-for-leaky",
        ),
    ],
)
def test_sandbox_command_bad_counting_or_headers_exit_2(args, message):
    """`batchrun sandbox` refuses what it cannot serve, before it listens."""
    result = runner.invoke(app, ["sandbox", "--port", "0", *args])
    assert result.exit_code == 2
    assert message in result.stderr


def test_sandbox_on_a_busy_port_exits_2():
    """`batchrun sandbox` on a port already in use says so and exits 2."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["sandbox", "--port", str(port)])
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_internal_errors_print_a_message_not_a_traceback(monkeypatch, capsys):
    """An unexpected exception becomes one line on stderr and exit 70 (a bug)."""
    import batchrun.cli.commands as cli

    def broken():
        msg = "boom"
        raise RuntimeError(msg)

    monkeypatch.setattr(cli, "app", broken)
    with pytest.raises(SystemExit) as info:
        cli.main()
    err = capsys.readouterr().err
    assert info.value.code == 70
    assert "internal error: RuntimeError: boom" in err
    assert "Traceback" not in err


def test_ctrl_c_exits_130(monkeypatch, capsys):
    """Ctrl-C outside a run exits 130, as a shell reports a SIGINT."""
    import batchrun.cli.commands as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "app", interrupted)
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 130


def test_deadline_with_failed_jobs_exits_1(tmp_path):
    """A deadline with jobs left does not hide failures: exit 1, saying both."""
    path = jobs_file(tmp_path, [f"q{i},run-query,t1," for i in range(10)])
    failing = ["--inject", "5xx=1", "--max-attempts", "1"]
    slow = ["--limit", "run-query=2/1m", "--deadline", "300ms"]
    result = runner.invoke(app, ["submit", str(path), "--sandbox", *failing, *slow])
    assert result.exit_code == 1, result.stderr
    assert "Stopped early with 8 job(s) left" in result.stderr
    assert "2 failed" in result.stdout


def test_deadline_without_failures_exits_75(tmp_path):
    """A deadline with jobs left and none failed exits 75, said once."""
    path = jobs_file(tmp_path, [f"q{i},run-query,t1," for i in range(10)])
    slow = ["--limit", "run-query=2/1m", "--deadline", "300ms"]
    result = runner.invoke(app, ["submit", str(path), "--sandbox", *slow])
    assert result.exit_code == 75, result.stderr
    assert (result.stdout + result.stderr).count("Stopped early") == 1


def test_no_color_flag_reaches_the_progress_view(tmp_path, monkeypatch):
    """submit --no-color opens the progress view without colour."""
    from batchrun.cli.progress import open_progress as real

    seen = {}

    def spy(stream, **options):
        seen.update(options)
        return real(stream, **options)

    monkeypatch.setattr("batchrun.cli.progress.open_progress", spy)
    result = runner.invoke(
        app, ["submit", str(jobs_file(tmp_path)), *FAST, "--no-color"]
    )
    assert result.exit_code == 0, result.stderr
    assert seen["color"] is False


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_a_closed_stdout_pipe_is_not_a_failure(tmp_path, command):
    """`batchrun validate jobs.csv | head -0`: the reader left, the command did its
    work, so it exits 0, with nothing on stderr."""
    import os
    import subprocess
    import sys

    path = jobs_file(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    env = {**os.environ, "BATCHRUN_STATE_DIR": str(tmp_path / "state")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "batchrun", command, str(path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
            timeout=20,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, b"")


LOG_LINE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d batchrun\[\d+\] jobs\.csv: ."


def test_every_submit_line_off_a_terminal_is_stamped(tmp_path):
    """Off a terminal (cron), every line of a submit, on stdout and on stderr, starts
    with the time, the process and the jobs file."""
    import re

    result = runner.invoke(app, ["submit", str(jobs_file(tmp_path)), *FAST])
    assert result.exit_code == 0, result.stderr
    output = result.stdout.splitlines() + result.stderr.splitlines()
    assert any("Results:" in line for line in output)
    assert [line for line in output if not re.match(LOG_LINE, line)] == []


def test_a_refused_submit_is_stamped_too(tmp_path):
    """A refused run's error (here a bad row, exit 2) names its time, process and
    file, so in a shared log it does not read as part of another run."""
    import re

    path = jobs_file(tmp_path, ["a,run-query,t1,", "b,no-such-type,t1,"])
    result = runner.invoke(app, ["submit", str(path), *FAST])
    assert result.exit_code == 2
    assert result.stderr.strip()
    assert all(re.match(LOG_LINE, line) for line in result.stderr.splitlines())


def test_a_long_wait_writes_a_waiting_line(tmp_path, monkeypatch):
    """While a run only waits for a slot, the log says so once per quiet spell
    (QUIET shortened here from 50 s)."""
    monkeypatch.setattr("batchrun.run.supervisor.QUIET", 0.2)
    monkeypatch.setattr("batchrun.cli.plain_log.QUIET", 0.2)
    path = jobs_file(tmp_path, [f"q{i},run-query,t1," for i in range(2)])
    args = ["submit", str(path), "--sandbox", "--limit", "run-query=1/1s"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert "waiting: run-query next slot in " in result.stdout


# Runs one command in a fresh interpreter, then names the heavy modules it loaded.
_LOADED = """
import atexit, sys
heavy = ("httpx", "starlette", "uvicorn", "redis")
atexit.register(lambda: print("loaded:", [m for m in heavy if m in sys.modules]))
sys.argv = ["batchrun", *sys.argv[1:]]
from batchrun.cli.commands import main
main()
"""


@pytest.mark.parametrize(
    "args", [["--help"], ["submit", "--help"], ["validate"], ["status"]]
)
def test_quick_commands_load_no_http_stack(tmp_path, args):
    """`--help`, `validate` and `status` start fast (cron runs them): neither the
    cli nor the arguments it parses import httpx, Starlette, uvicorn or redis."""
    import os
    import subprocess
    import sys

    path = jobs_file(tmp_path)
    full = [*args, str(path)] if args[0] in ("validate", "status") else args
    env = {**os.environ, "BATCHRUN_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, *full],
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
        check=False,
    )
    assert done.stdout.splitlines()[-1] == "loaded: []", done.stderr


def test_python_dash_m_runs_the_cli():
    """`python -m batchrun` is the same command."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "batchrun", "--version"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("batchrun ")


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.binary(max_size=200), jsonl=st.booleans())
def test_validate_any_bytes_exits_0_or_2_with_a_message(tmp_path, data, jsonl):
    """Fuzz: whatever the file holds, validate exits 0 or 2 with words, never a traceback."""
    path = tmp_path / ("f.jsonl" if jsonl else "f.csv")
    path.write_bytes(data)
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code in (0, 2)
    assert (result.stdout if result.exit_code == 0 else result.stderr).strip()
    assert "Traceback" not in result.stdout + result.stderr


def test_cron_line_of_a_missing_file_exits_2(tmp_path):
    """cron-line checks now what would fail every night: a jobs file not there."""
    result = runner.invoke(app, ["cron-line", str(tmp_path / "nope.csv")])
    assert result.exit_code == 2
    assert "nope.csv: no such file." in result.stderr


def test_cron_line_keeps_the_token_out_and_says_where_it_goes(tmp_path, monkeypatch):
    """With BATCHRUN_TOKEN set and no --env-file, the line holds no token and a
    note on stderr says to use --env-file."""
    monkeypatch.setenv("BATCHRUN_TOKEN", TOKEN)
    result = runner.invoke(app, ["cron-line", str(jobs_file(tmp_path))])
    assert result.exit_code == 0, result.stderr
    assert TOKEN not in result.stdout + result.stderr
    assert "--env-file" in result.stderr
    assert result.stdout.startswith("0 1 * * * mkdir -p ")


def test_cron_line_says_its_next_run_on_stderr(tmp_path):
    """stdout is the one line, for `| crontab -`; stderr says when cron starts
    it next; a schedule cron cannot run is refused before a line is printed."""
    path = str(jobs_file(tmp_path))
    result = runner.invoke(app, ["cron-line", path, "--schedule", "30 2 * * 1-5"])
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
    assert re.search(
        r"Next run: (Mon|Tue|Wed|Thu|Fri) \d{4}-\d\d-\d\d 02:30 \(", result.stderr
    )
    refused = runner.invoke(app, ["cron-line", path, "--schedule", "0 1 31 2 *"])
    assert refused.exit_code == 2
    assert refused.stdout == ""
    assert "'0 1 31 2 *' is not a cron schedule" in refused.stderr


@pytest.mark.parametrize(
    ("mode", "warned"),
    [
        pytest.param(0o600, False, id="600"),
        pytest.param(0o644, True, id="644"),
        pytest.param(0o640, True, id="640"),
    ],
)
def test_cron_line_warns_of_an_env_file_others_can_read(tmp_path, mode, warned):
    """--env-file holds the token: readable by group or others is warned of."""
    env = tmp_path / "batchrun.env"
    env.write_text(f"BATCHRUN_TOKEN={TOKEN}\n")
    env.chmod(mode)
    result = runner.invoke(
        app, ["cron-line", str(jobs_file(tmp_path)), "--env-file", str(env)]
    )
    assert result.exit_code == 0, result.stderr
    assert (f"chmod 600 {env}" in result.stderr) is warned
    assert TOKEN not in result.stdout + result.stderr


def test_config_json_gives_numbers_as_numbers(tmp_path):
    """`config --json`: a concurrency set in the config file is a number, not
    its text (its default, "as the limits need", is words)."""
    path = tmp_path / "user-config" / "batchrun" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("concurrency = 12\n")
    shown = json.loads(runner.invoke(app, ["config", "--json"]).stdout)
    assert shown["settings"]["concurrency"]["value"] == 12


def test_a_state_error_inside_an_exception_group_exits_74(monkeypatch, tmp_path):
    """An error raised in a run's task group is unwrapped at the edge: its message
    and exit code, not "internal error" and 1."""
    import batchrun.run.submission as submission

    def grouped(job, *, say):
        msg = "/x/ledger.db is damaged (file is not a database). Move it aside."
        group = "unhandled errors in a TaskGroup"
        raise ExceptionGroup(group, [StateError(msg)])

    monkeypatch.setattr(submission, "submit", grouped)
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id,type,team_id,payload\nq,run-query,t,\n")
    result = runner.invoke(app, ["submit", str(jobs), "--sandbox"])
    assert result.exit_code == 74
    # Off a terminal submit stamps its stderr lines; the message ends the line.
    assert result.stderr.endswith(
        "Error: /x/ledger.db is damaged (file is not a database). Move it aside.\n"
    )
    assert "internal error" not in result.stderr


def test_an_internal_error_in_an_exception_group_exits_70(monkeypatch, capsys):
    """A bug in a task group is reported leaf by leaf, exit 70, even beside a
    BatchrunError."""
    import batchrun.cli.commands as cli

    def broken():
        boom, damaged, group = "boom", "x.db is damaged", "group"
        inner = ExceptionGroup(group, [RuntimeError(boom)])
        raise ExceptionGroup(group, [inner, StateError(damaged)])

    monkeypatch.setattr(cli, "app", broken)
    with pytest.raises(SystemExit) as info:
        cli.main()
    err = capsys.readouterr().err
    assert info.value.code == 70
    assert "internal error: RuntimeError: boom" in err
    assert "Traceback" not in err


def test_ctrl_c_inside_an_exception_group_exits_130(monkeypatch):
    """A Ctrl-C that reaches the edge inside a task group's group is a Ctrl-C."""
    import batchrun.cli.commands as cli

    def interrupted():
        group = "group"
        raise BaseExceptionGroup(group, [KeyboardInterrupt()])

    monkeypatch.setattr(cli, "app", interrupted)
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 130


def test_a_stopped_sandbox_run_resumes(tmp_path, monkeypatch):
    """A sandbox run keeps its state apart from real runs (in the state folder's
    `sandbox`): stopped, it says to run it again, and the rerun sends only the
    rest; the results file holds one line per job."""
    state = tmp_path / "state"
    monkeypatch.setenv("BATCHRUN_STATE_DIR", str(state))
    jobs = tmp_path / "jobs.csv"
    rows = [f"i{n},invite,t," for n in range(20)]
    jobs.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    # 15/5m: the last 5 invites wait minutes, so the deadline stops the run.
    result = runner.invoke(app, ["submit", str(jobs), "--sandbox", "--deadline", "1s"])
    assert result.exit_code == 75, result.output
    assert "Stopped early with 5 job(s) left: run the same command" in result.stderr
    assert "not kept" not in result.stderr
    assert list((state / "sandbox" / "runs").glob("*/*.db"))
    assert not (state / "runs").exists()
    again = runner.invoke(app, ["submit", str(jobs), *FAST])
    assert again.exit_code == 0, again.stderr
    assert "Resuming: 15 done earlier, 5 to send" in again.stderr
    ids = [r["id"] for r in results_of(tmp_path)]
    assert sorted(ids) == sorted(f"i{n}" for n in range(20))


def test_a_sandbox_run_honours_an_explicit_state_dir(tmp_path):
    """--state-dir DIR keeps a sandbox run's state in DIR/sandbox."""
    jobs = jobs_file(tmp_path)
    state = tmp_path / "elsewhere"
    result = runner.invoke(app, ["submit", str(jobs), *FAST, "--state-dir", str(state)])
    assert result.exit_code == 0, result.stderr
    assert list((state / "sandbox" / "runs").glob("*/*.db"))


def test_a_sandbox_file_whose_results_exist_sends_only_the_rest(tmp_path):
    """A sandbox results file no store keeps (an older batchrun's run) counts: the
    jobs it records as ended are not sent again, nor written twice."""
    jobs = jobs_file(tmp_path)
    first = runner.invoke(app, ["submit", str(jobs), *FAST])
    assert first.exit_code == 0, first.stderr
    lines = (tmp_path / "jobs.sandbox.results.jsonl").read_text().splitlines()
    (tmp_path / "jobs.sandbox.results.jsonl").write_text("\n".join(lines[:2]) + "\n")
    shutil.rmtree(tmp_path / "state" / "sandbox")
    again = runner.invoke(app, ["submit", str(jobs), *FAST])
    assert again.exit_code == 0, again.stderr
    ids = [r["id"] for r in results_of(tmp_path)]
    assert len(ids) == len(set(ids)) == len(lines)


@pytest.mark.parametrize(
    "rerun",
    [
        pytest.param(["--retry-unknown"], id="retry-unknown"),
        pytest.param(["--restart"], id="restart"),
        pytest.param(["--run-id", "second"], id="new-round"),
    ],
)
def test_a_results_file_never_holds_two_lines_for_one_id(tmp_path, rerun):
    """Whatever is sent again (unknown invites, a restart, a new round), the
    results file keeps one line per id: the newest."""
    jobs = tmp_path / "jobs.csv"
    rows = [f"i{n},invite,t," for n in range(6)]
    jobs.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    first = runner.invoke(app, ["submit", str(jobs), *FAST, "--inject", "5xx=1"])
    assert first.exit_code == 1, first.stderr
    again = runner.invoke(app, ["submit", str(jobs), *FAST, *rerun])
    assert again.exit_code == 0, again.stderr
    found = results_of(tmp_path)
    assert sorted(r["id"] for r in found) == [f"i{n}" for n in range(6)]
    assert {r["status"] for r in found} == {"done"}


def test_shell_completion_is_offered(monkeypatch):
    """`batchrun --show-completion bash` prints the script the README points to.
    (Typer reads the shell from the process tree unless told not to: without a
    shell above the tests, as under a job runner, it found none.)"""
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = runner.invoke(app, ["--show-completion", "bash"])
    assert result.exit_code == 0
    assert "_BATCHRUN_COMPLETE" in result.stdout


def test_quiet_and_verbose_together_are_refused(tmp_path):
    path = jobs_file(tmp_path)
    result = runner.invoke(app, ["submit", str(path), "--sandbox", "-q", "-v"])
    assert result.exit_code == 2
    assert "--quiet and --verbose" in result.stderr


def test_quiet_submit_prints_the_summary_only(tmp_path):
    result = runner.invoke(app, ["submit", str(jobs_file(tmp_path)), "--sandbox", "-q"])
    assert result.exit_code == 0, result.stderr
    assert "summary:" in result.stdout
    assert "starting:" not in result.stdout


def test_the_summary_says_when_concurrency_set_the_pace(tmp_path):
    """One request in flight at a time, each answered in 20 ms, under a limit
    of 1000 a second: the cap, not the limit, set the pace, and the run says
    so as it starts to and in its summary, naming the flag."""
    rows = [f"q{i},avatar,," for i in range(20)]
    path = jobs_file(tmp_path, rows=rows)
    args = ["--sandbox", "--limit", "avatar=1000/1s", "--concurrency", "1"]
    slow = ["--inject", "slow=1", "--inject", "slow-seconds=0.02"]
    result = runner.invoke(app, ["submit", str(path), *args, *slow])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "Concurrency sets the pace, not the limit: 1 in flight at most" in out
    said = "Concurrency, not the limit, set the pace for "
    assert said in out
    assert "1 in flight at most (--concurrency 1)." in out.split(said)[1]


# `global`, wherever a key shows (issue 37)

REQUEST_ROWS = (
    "g1,request,t1,,GET,/teams/{team_id}/reports?page=1",
    "g2,request,t1,,DELETE,/teams/{team_id}/members/m2",
    'r1,request,t1,"{""q"": 1}",POST,/teams/{team_id}/data/run-query',
    "q1,run-query,t1,,,",
)


def request_file(tmp_path, rows=REQUEST_ROWS):
    path = tmp_path / "jobs.csv"
    path.write_text("id,type,team_id,payload,method,path\n" + "\n".join(rows) + "\n")
    return path


def test_validate_says_which_budget_each_group_draws_on(tmp_path):
    """validate names each budget and the types of job that draw on it."""
    result = runner.invoke(app, ["validate", str(request_file(tmp_path))])
    assert result.exit_code == 0, result.stderr
    assert "  budgets: global 2 (request), run-query 2 (request 1, run-query 1)" in (
        result.stdout
    )
    data = json.loads(
        runner.invoke(app, ["validate", str(request_file(tmp_path)), "--json"]).stdout
    )
    assert data["per_budget"] == {
        "global": {"request": 2},
        "run-query": {"request": 1, "run-query": 1},
    }


def test_global_shows_wherever_a_key_shows(tmp_path):
    """plan, the run's log and summary, the metrics file, status and limits all
    show the global budget that the request jobs draw on."""
    from batchrun.core.limits import limit_table
    from batchrun.sandbox.app import create_app
    from batchrun.sandbox.serving import running

    jobs = request_file(tmp_path)
    metrics = tmp_path / "batchrun.prom"
    with running(create_app(rules=limit_table())) as url:
        base = ["--base-url", url]
        plan = runner.invoke(app, ["plan", str(jobs), *base])
        run = runner.invoke(
            app, ["submit", str(jobs), *base, "--metrics-file", str(metrics)]
        )
        status = runner.invoke(app, ["status", str(jobs), *base])
        limits = runner.invoke(app, ["limits", *base])
    assert "2 global jobs (requests) at 120/1m" in plan.stdout
    assert "2 run-query jobs (1 of them requests) at 15/1m+500/1h" in plan.stdout
    assert run.exit_code == 0, run.stderr
    assert "global: all 2 jobs ended (2 done, 0 failed)" in run.stdout
    assert re.search(r"  global +2 +0 +0", run.stdout), run.stdout
    assert "global responses: 200: 2" in run.stdout
    assert 'batchrun_jobs{endpoint="global"' in metrics.read_text()
    assert "global: 2 done" in status.stdout
    assert "global: 120/1m" in limits.stdout


def test_a_stricter_global_limit_is_learned_from(tmp_path):
    """--server-limit global=RULE makes the sandbox stricter on other paths; the
    run learns it for global as for any key, and every request ends done once."""
    rows = [f"g{i},request,t1,,GET,/teams/{{team_id}}/r?n={i}" for i in range(20)]
    args = ["--time-scale", "100", "--limit", "global=30/1m"]
    args += ["--server-limit", "global=5/1m"]
    result = runner.invoke(
        app, ["submit", str(request_file(tmp_path, rows)), *FAST[:1], *args]
    )
    assert result.exit_code == 0, result.stderr
    said = (
        r"global: the server allows less than the rule; now 5/(\d+ms\+30/600ms|600ms)"
    )
    assert re.search(said, result.stdout), result.stdout
    ended = results_of(tmp_path)
    assert sorted(r["id"] for r in ended) == sorted(f"g{i}" for i in range(20))
    assert {r["status"] for r in ended} == {"done"}
