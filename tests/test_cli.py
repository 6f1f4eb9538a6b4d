"""The command line: every command, every exit code of the contract, no token shown."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from batchrun.cli import app
from batchrun.errors import StateError

runner = CliRunner()
TOKEN = "tok-3f9a-SECRET"
FAST = ["--sandbox", "--time-scale", "1000"]


def jobs_file(tmp_path, rows=("a,run-query,t1,", "b,invite,t1,", "c,avatar,,")):
    path = tmp_path / "jobs.csv"
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def results_of(tmp_path):
    text = (tmp_path / "jobs.results.jsonl").read_text()
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


def test_submit_to_sandbox_sends_every_job_and_exits_0(tmp_path):
    """submit --sandbox ends every job done, writes results, exits 0."""
    path = jobs_file(tmp_path)
    result = runner.invoke(app, ["submit", str(path), *FAST])
    assert result.exit_code == 0, result.stderr
    assert {r["id"]: r["status"] for r in results_of(tmp_path)} == dict.fromkeys(
        "abc", "done"
    )
    assert "3 done, 0 failed, 0 left" in result.stdout


def test_submit_refuses_a_bad_file_before_sending(tmp_path):
    """A bad row: exit 2, nothing sent, no results file."""
    path = jobs_file(tmp_path, ["a,avatar,,", "b,invite,,"])
    result = runner.invoke(app, ["submit", str(path), *FAST])
    assert result.exit_code == 2
    assert "line 3: team_id is missing" in result.stderr
    assert not (tmp_path / "jobs.results.jsonl").exists()


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
    from batchrun.limits import limit_table
    from batchrun.sandbox import create_app
    from batchrun.serving import running

    with running(create_app(rules=limit_table())) as url:
        result = runner.invoke(
            app,
            ["submit", str(jobs_file(tmp_path)), "--base-url", url + "/wrong-prefix"],
        )
    assert result.exit_code == 1
    assert {r["http_status"] for r in results_of(tmp_path)} == {404}


def test_token_is_never_shown(tmp_path):
    """The token appears in no output and not in the results file."""
    path = jobs_file(tmp_path)
    result = runner.invoke(app, ["submit", str(path), *FAST, "--token", TOKEN])
    assert result.exit_code == 0
    assert TOKEN not in result.stdout + result.stderr
    assert TOKEN.encode() not in (tmp_path / "jobs.results.jsonl").read_bytes()


def test_token_comes_from_the_environment(tmp_path):
    """BATCHRUN_TOKEN is sent as the bearer token."""
    from batchrun.limits import limit_table
    from batchrun.sandbox import create_app
    from batchrun.serving import running

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
def test_plain_http_to_a_remote_host_warns(capsys, url, warned):
    """http:// to a host that is not loopback warns that the token travels in clear."""
    from batchrun.cli import _check_base_url

    _check_base_url(url)
    assert ("plain http://" in capsys.readouterr().err) is warned


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
    import batchrun.cli as cli

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


def test_ctrl_c_exits_75(monkeypatch, capsys):
    """Ctrl-C outside a run exits 75, the contract's 'stopped early'."""
    import batchrun.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "app", interrupted)
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 75


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


def test_a_state_error_inside_an_exception_group_exits_74(monkeypatch, tmp_path):
    """An error raised in a run's task group is unwrapped at the edge: its message
    and exit code, not "internal error" and 1."""
    import batchrun.submission as submission

    def grouped(job, *, say):
        msg = "/x/ledger.db is damaged (file is not a database). Move it aside."
        group = "unhandled errors in a TaskGroup"
        raise ExceptionGroup(group, [StateError(msg)])

    monkeypatch.setattr(submission, "submit", grouped)
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id,type,team_id,payload\nq,run-query,t,\n")
    result = runner.invoke(app, ["submit", str(jobs), "--sandbox"])
    assert result.exit_code == 74
    assert result.stderr == (
        "Error: /x/ledger.db is damaged (file is not a database). Move it aside.\n"
    )


def test_an_internal_error_in_an_exception_group_exits_70(monkeypatch, capsys):
    """A bug in a task group is reported leaf by leaf, exit 70, even beside a
    BatchrunError."""
    import batchrun.cli as cli

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


def test_ctrl_c_inside_an_exception_group_exits_75(monkeypatch):
    """A Ctrl-C that reaches the edge inside a task group's group is a stop."""
    import batchrun.cli as cli

    def interrupted():
        group = "group"
        raise BaseExceptionGroup(group, [KeyboardInterrupt()])

    monkeypatch.setattr(cli, "app", interrupted)
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 75


def test_a_stopped_sandbox_run_does_not_claim_it_resumes(tmp_path):
    """A sandbox run's state is temporary: stopped, it says running it again starts
    over, in its log and its message, and never that it resumes."""
    jobs = tmp_path / "jobs.csv"
    rows = [f"i{n},invite,t," for n in range(20)]
    jobs.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    # 15/5m: the last 5 invites wait minutes, so the deadline stops the run.
    result = runner.invoke(app, ["submit", str(jobs), "--sandbox", "--deadline", "1s"])
    assert result.exit_code == 75, result.output
    assert "resume" not in result.stdout + result.stderr
    assert "sandbox runs are not kept" in result.stdout
    assert "sandbox runs are not kept" in result.stderr
