"""The config files: read, checked, merged under flags and env, shown by `config`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from batchrun.cli import config
from batchrun.cli.commands import app
from batchrun.core.errors import Exit, UsageError
from batchrun.run.exit_code import Ending

runner = CliRunner()
TOKEN = "tok-3f9a-SECRET"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The current folder is a project folder of the test's own."""
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture
def user_file(tmp_path):
    """The user's config.toml (conftest points XDG_CONFIG_HOME into tmp_path)."""
    path = tmp_path / "user-config" / "batchrun" / "config.toml"
    path.parent.mkdir(parents=True)
    return path


def write_jobs(folder):
    path = folder / "jobs.csv"
    path.write_text("id,type,team_id,payload\nq1,run-query,t1,\ni1,invite,t1,\n")
    return path


def plan_rules(*args):
    result = runner.invoke(app, ["plan", "jobs.csv", "--json", *args])
    assert result.exit_code == 0, result.output
    return {p["key"]: p["rule"] for p in json.loads(result.stdout)["keys"]}


def test_no_file_is_no_setting(project):
    """Without config files, nothing is set."""
    found = config.load()
    assert (found.settings, found.limits) == ({}, {})


def test_the_project_file_wins_over_the_users(project, user_file):
    """A key in both files takes the project's value; others come from either."""
    user_file.write_text(
        'profile = "auto"\nconcurrency = 3\n[limits]\ninvite = "9/5m"\n'
    )
    (project / "batchrun.toml").write_text('profile = "a"\n[limits]\navatar = "2/m"\n')
    found = config.load()
    assert found.params() == {"profile": "a", "concurrency": 3}
    assert found.settings["profile"].source == project / "batchrun.toml"
    assert found.limit_flags() == ["invite=9/5m", "avatar=2/m"]


def test_a_relative_state_dir_is_the_files(project):
    """state-dir is taken relative to the file that names it."""
    (project / "batchrun.toml").write_text('state-dir = ".state"\n')
    assert config.load().params()["state_dir"] == project / ".state"


def test_the_night_shift_keys_are_read(project):
    """metrics-file (relative to the file), halt-after (a count or a share) and
    budget-key are settings as their flags are."""
    (project / "batchrun.toml").write_text(
        'metrics-file = "m/run.prom"\nhalt-after = 10\nbudget-key = "prod"\n'
    )
    assert config.load().params() == {
        "metrics_file": project / "m" / "run.prom",
        "halt_after": "10",
        "budget_key": "prod",
    }
    (project / "batchrun.toml").write_text('halt-after = "5 %"\n')
    assert config.load().params() == {"halt_after": "5%"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            'base_url = "x"\n',
            "unknown key 'base_url' (did you mean 'base-url'?)",
            id="unknown-key",
        ),
        pytest.param(
            'profile = "c"\n',
            "profile must be one of a, b, auto, got 'c'",
            id="bad-profile",
        ),
        pytest.param(
            "concurrency = 0\n",
            "concurrency must be a whole number of 1 or more",
            id="zero",
        ),
        pytest.param(
            'concurrency = "8"\n',
            "concurrency must be a whole number",
            id="string-count",
        ),
        pytest.param("ledger = 3\n", "ledger must be a string", id="ledger-number"),
        pytest.param(
            '[limits]\nquery = "1/m"\n',
            "limits.query = '1/m' is not a limit",
            id="limit-key",
        ),
        pytest.param(
            '[limits]\ninvite = "fast"\n',
            "limits.invite = 'fast' is not a limit",
            id="limit-rule",
        ),
        pytest.param('limits = "x"\n', "limits must be a table", id="limits-not-table"),
        pytest.param('profile = "a\n', "is not valid TOML", id="bad-toml"),
        pytest.param(
            'halt-after = "0%"\n',
            "halt-after = '0%': --halt-after must be a share above 0%",
            id="halt-zero",
        ),
        pytest.param(
            "halt-after = 2.5\n",
            "halt-after = 2.5: bad --halt-after '2.5'",
            id="halt-float",
        ),
        pytest.param(
            'budget-key = ""\n', "budget-key must be a string", id="budget-empty"
        ),
        pytest.param(
            'budget-key = "a\\u0007b"\n',
            "--budget-key must be a name of 1 to 100 printable",
            id="budget-control",
        ),
    ],
)
def test_a_bad_file_exits_2_naming_file_and_key(project, text, expected):
    """A bad file is a usage error (exit 2, no traceback) that names the file and
    what is wrong in it, for any command."""
    (project / "batchrun.toml").write_text(text)
    with pytest.raises(UsageError, match=r"batchrun\.toml"):
        config.load()
    result = runner.invoke(app, ["status", "jobs.csv"])
    assert result.exit_code == 2
    assert expected in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "text",
    [
        f'token = "{TOKEN}"\n',
        f'[limits]\ntoken = "{TOKEN}"\n',
        'redis_password = "x"\n',
    ],
)
def test_a_token_in_a_file_is_refused(project, text):
    """A file that holds a token (or password) is refused, pointing to
    BATCHRUN_TOKEN; the token is not echoed."""
    (project / "batchrun.toml").write_text(text)
    result = runner.invoke(app, ["config"])
    assert result.exit_code == 2
    assert "BATCHRUN_TOKEN" in result.stderr
    assert TOKEN not in result.output


def test_flag_beats_env_beats_project_beats_user(project, user_file, monkeypatch):
    """state-dir: the user file, then the project file, then the variable, then
    the flag win in turn (status reads the run from the folder in force)."""
    write_jobs(project)
    for name in ("user", "project", "env", "flag"):
        (project / name).mkdir()
    monkeypatch.delenv("BATCHRUN_STATE_DIR")

    def state_in_force(*flags):
        result = runner.invoke(app, ["config", "--json", *flags])
        return json.loads(result.stdout)["settings"]["state-dir"]

    user_file.write_text(f'state-dir = "{project / "user"}"\n')
    assert state_in_force()["value"] == str(project / "user")
    (project / "batchrun.toml").write_text('state-dir = "project"\n')
    assert state_in_force() == {
        "value": str(project / "project"),
        "source": str(project / "batchrun.toml"),
    }
    monkeypatch.setenv("BATCHRUN_STATE_DIR", str(project / "env"))
    assert state_in_force()["source"] == "BATCHRUN_STATE_DIR"


def test_config_json_gives_a_files_number_as_a_number(project, user_file):
    """A concurrency set in batchrun.toml is a number in `config --json`."""
    (project / "batchrun.toml").write_text("concurrency = 3\n")
    shown = json.loads(runner.invoke(app, ["config", "--json"]).stdout)
    assert shown["settings"]["concurrency"]["value"] == 3


def test_a_command_takes_the_files_profile_and_limits(project, user_file):
    """plan paces by the file's profile and [limits]; --profile and --limit win,
    --limit only for its own key."""
    write_jobs(project)
    user_file.write_text('profile = "b"\n')
    (project / "batchrun.toml").write_text('profile = "a"\n[limits]\ninvite = "9/5m"\n')
    assert plan_rules() == {"run-query": "30/1m", "invite": "9/5m"}
    assert plan_rules("--profile", "b", "--limit", "run-query=5/m") == {
        "run-query": "5/1m",
        "invite": "9/5m",
    }
    assert plan_rules("--limit", "invite=3/5m")["invite"] == "3/5m"


def submitted(monkeypatch, *args):
    """What `submit jobs.csv` would run, caught before it sends anything."""
    from batchrun.run import submission

    caught = []

    def fake_submit(job, say):
        caught.append(job)
        return Ending(Exit.OK)

    monkeypatch.setattr(submission, "submit", fake_submit)
    result = runner.invoke(app, ["submit", "jobs.csv", *args])
    assert result.exit_code == 0, result.output
    return caught[0]


def test_submit_takes_the_files_settings(project, monkeypatch):
    """With no flag and no variable, submit takes base URL, concurrency, ledger
    and state folder from the file."""
    write_jobs(project)
    monkeypatch.delenv("BATCHRUN_STATE_DIR")
    (project / "batchrun.toml").write_text(
        'base-url = "http://127.0.0.1:9"\nconcurrency = 2\nstate-dir = "st"\n'
        'ledger = "redis://127.0.0.1:9/0"\n'
    )
    job = submitted(monkeypatch)
    assert job.target.base_url == "http://127.0.0.1:9"
    assert job.settings.concurrency == 2
    assert job.state.root == project / "st"
    assert job.ledger_url == "redis://127.0.0.1:9/0"


def test_flags_and_env_beat_the_file_in_submit(project, monkeypatch):
    """A variable wins over the file, and a flag over both."""
    write_jobs(project)
    (project / "batchrun.toml").write_text(
        'base-url = "http://127.0.0.1:9"\nconcurrency = 2\nstate-dir = "st"\n'
    )
    monkeypatch.setenv("BATCHRUN_BASE_URL", "http://127.0.0.1:10")
    job = submitted(monkeypatch, "--concurrency", "5")
    assert job.target.base_url == "http://127.0.0.1:10"
    assert job.settings.concurrency == 5
    assert job.state.root != project / "st"
    job = submitted(monkeypatch, "--base-url", "http://127.0.0.1:11")
    assert job.target.base_url == "http://127.0.0.1:11"


def test_config_shows_sources_and_never_the_token(project, monkeypatch):
    """`config` names each value's source; the token only as set, never its value;
    a ledger password as ***."""
    (project / "batchrun.toml").write_text(
        'ledger = "redis://:pw-9@127.0.0.1:6379/0"\n[limits]\ninvite = "9/5m"\n'
    )
    monkeypatch.setenv("BATCHRUN_TOKEN", TOKEN)
    monkeypatch.setenv("BATCHRUN_BASE_URL", "https://api.example")
    result = runner.invoke(app, ["config"])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert any(
        " https://api.example " in line and line.endswith("BATCHRUN_BASE_URL")
        for line in lines
    )
    assert any(
        line.startswith("profile") and line.endswith("default") for line in lines
    )
    assert any(
        line.strip().startswith("invite") and line.endswith("batchrun.toml")
        for line in lines
    )
    assert any(
        line.strip().startswith("run-query") and line.endswith("profile b")
        for line in lines
    )
    assert "redis://:***@127.0.0.1" in result.stdout
    assert "set in BATCHRUN_TOKEN" in result.stdout
    assert TOKEN not in result.output
    assert "pw-9" not in result.output


def test_the_sandbox_ignores_the_clients_profile(project, monkeypatch):
    """The sandbox is the server: a client's profile = "auto" does not reach it
    (it would refuse auto)."""
    from batchrun.sandbox import serving

    (project / "batchrun.toml").write_text('profile = "auto"\n')
    monkeypatch.setattr(serving, "serve", lambda *args, **kwargs: None)
    result = runner.invoke(app, ["sandbox"])
    assert result.exit_code == 0, result.output


def test_cron_line_runs_in_the_project_folder(project):
    """cron starts in the home folder: a project's line cds to it first, so
    submit reads its batchrun.toml."""
    write_jobs(project)
    (project / "batchrun.toml").write_text('profile = "a"\n')
    result = runner.invoke(app, ["cron-line", "jobs.csv"])
    assert result.exit_code == 0, result.output
    assert f"{{ cd {project} && " in result.stdout
