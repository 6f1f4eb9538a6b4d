"""Where the state folder keeps things, and the fingerprint that names a client.

Pure path arithmetic, plus making private folders: folders batchrun makes are 0700,
so a run's jobs, payloads and send times are the user's alone; a folder that exists
is left as its owner set it (a read-only one is reported, never chmodded). Only
`submit` makes folders: `status`, `plan` and `validate` write nothing. No token is
ever part of a path or stored: a client is named by a hash of base URL and token.

A run store is named by its API alone (a hash of the base URL): the budget is the
client's (base URL and token), but a renewed token is the same client's run, so
rotating it resumes the run instead of starting over.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from batchrun.core.errors import StateError, UsageError

_BUDGET_KEY_MAX = 100


def client_fingerprint(base_url: str, token: str | None) -> str:
    """Names a client (base URL + token) without revealing the token."""
    text = f"{base_url.rstrip('/')}\0{token or ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_budget_key(name: str) -> str:
    """A budget's name as given (`--budget-key`, `budget-key`): printable text.

    Raises:
        UsageError: when it is empty, too long or holds a control character.
    """
    if not name.strip() or len(name) > _BUDGET_KEY_MAX or not name.isprintable():
        msg = (
            f"--budget-key must be a name of 1 to {_BUDGET_KEY_MAX} printable "
            "characters, e.g. --budget-key reporting-prod (every process that "
            "gives it draws on one budget)."
        )
        raise UsageError(msg)
    return name


def budget_fingerprint(name: str) -> str:
    """Names a client by the budget it draws on (`--budget-key NAME`), whatever
    its base URL and token: rotated or sibling tokens of one quota share it."""
    text = f"budget\0{name}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def api_fingerprint(base_url: str) -> str:
    """Names an API (its base URL): the run store of a jobs file for it."""
    return hashlib.sha256(base_url.rstrip("/").encode()).hexdigest()[:16]


def user_config_file() -> Path:
    """The user's config file: config.toml in their config folder
    (`~/.config/batchrun` on Linux, or under `$XDG_CONFIG_HOME`)."""
    return Path(platformdirs.user_config_dir("batchrun")) / "config.toml"


def _private_dir(path: Path) -> Path:
    """Create `path` (and parents) readable by the user only, unless it exists."""
    if path.is_dir():
        return path
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.chmod(0o700)  # mkdir's mode is masked by the umask
    except OSError as exc:
        msg = (
            f"cannot make the state folder {path}: {exc.strerror or exc}. "
            "Make its parent writable by you, or use another --state-dir."
        )
        raise StateError(msg) from None
    return path


@dataclass(frozen=True, slots=True)
class StatePaths:
    """Where a state folder keeps the ledger, the run stores and the locks."""

    root: Path

    @classmethod
    def resolve(cls, explicit: Path | None, *, create: bool = True) -> StatePaths:
        """--state-dir (or BATCHRUN_STATE_DIR), else the user's state folder; made
        if missing, unless not `create` (for commands that only read)."""
        root = (explicit or Path(platformdirs.user_state_dir("batchrun"))).expanduser()
        return cls(_private_dir(root) if create else root)

    def sandbox(self) -> StatePaths:
        """Where `--sandbox` runs keep their state: apart from real runs, as their
        results are, in a folder of this one (made when first used)."""
        return StatePaths(self.root / "sandbox")

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.db"

    def run_folder(self, jobs_file: Path) -> Path:
        digest = hashlib.sha256(str(jobs_file.resolve()).encode()).hexdigest()[:16]
        return self.root / "runs" / digest

    def make_run_folder(self, jobs_file: Path) -> Path:
        """The run folder of `jobs_file`, made if missing."""
        _private_dir(self.root / "runs")
        return _private_dir(self.run_folder(jobs_file))

    def run_store(self, jobs_file: Path, api: str) -> Path:
        """Where `submit` keeps the jobs of `jobs_file` for the API named `api`
        (api_fingerprint; folder made)."""
        return self.make_run_folder(jobs_file) / f"{api}.db"

    def stdin_copy(self, results: Path, suffix: str) -> Path:
        """Where `submit -` keeps the jobs it read from stdin: named by the results
        file, the one name a pipe's run has."""
        digest = hashlib.sha256(str(results.resolve()).encode()).hexdigest()[:16]
        return _private_dir(self.root / "stdin") / f"{digest}{suffix}"

    def run_stores(self) -> list[Path]:
        """Every run store in the state folder, of any jobs file and API."""
        return sorted((self.root / "runs").glob("*/*.db"))
