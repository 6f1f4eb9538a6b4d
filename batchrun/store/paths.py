"""Where the state folder keeps things.

Pure path arithmetic, plus making private folders: folders batchrun makes are 0700,
so a run's jobs, payloads and send times are the user's alone; a folder that exists
is left as its owner set it (a read-only one is reported, never chmodded). Only
`submit` makes folders: `status`, `plan` and `validate` write nothing. No token is
ever part of a path or stored: a client and an API are named by hashes
(`core.identity`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from batchrun.core.errors import StateError


def user_config_file() -> Path:
    """The user's config file: config.toml in their config folder
    (`~/.config/batchrun` on Linux, or under `$XDG_CONFIG_HOME`)."""
    return Path(platformdirs.user_config_dir("batchrun")) / "config.toml"


def user_state_folder() -> Path:
    """The user's state folder (`~/.local/state/batchrun` on Linux, or under
    `$XDG_STATE_HOME`): where state is kept with no --state-dir."""
    return Path(platformdirs.user_state_dir("batchrun"))


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

    def made(self) -> StatePaths:
        """This state folder, made (private) if missing: only commands that write
        make it."""
        _private_dir(self.root)
        return self

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
        (`core.identity.api_fingerprint`; folder made)."""
        return self.make_run_folder(jobs_file) / f"{api}.db"

    def stdin_copy(self, results: Path, suffix: str) -> Path:
        """Where `submit -` keeps the jobs it read from stdin: named by the results
        file, the one name a pipe's run has."""
        digest = hashlib.sha256(str(results.resolve()).encode()).hexdigest()[:16]
        return _private_dir(self.root / "stdin") / f"{digest}{suffix}"

    def run_stores(self) -> list[Path]:
        """Every run store in the state folder, of any jobs file and API."""
        return sorted((self.root / "runs").glob("*/*.db"))
