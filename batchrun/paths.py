"""Where the state folder keeps things, and the fingerprint that names a client.

Pure path arithmetic, plus making private folders: folders are 0700, so a run's
jobs, payloads and send times are the user's alone. No token is ever part of a
path or stored: a client is named by a hash of base URL and token.

A run store is named by its API alone (a hash of the base URL): the budget is the
client's (base URL and token), but a renewed token is the same client's run, so
rotating it resumes the run instead of starting over.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from batchrun.errors import UsageError


def client_fingerprint(base_url: str, token: str | None) -> str:
    """Names a client (base URL + token) without revealing the token."""
    text = f"{base_url.rstrip('/')}\0{token or ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def api_fingerprint(base_url: str) -> str:
    """Names an API (its base URL): the run store of a jobs file for it."""
    return hashlib.sha256(base_url.rstrip("/").encode()).hexdigest()[:16]


def _private_dir(path: Path) -> Path:
    """Create `path` (and parents) readable by the user only."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.chmod(0o700)
    except OSError as exc:
        msg = f"cannot use state folder {path}: {exc.strerror or exc}. See --state-dir."
        raise UsageError(msg) from None
    return path


@dataclass(frozen=True, slots=True)
class StatePaths:
    """Where a state folder keeps the ledger, the run stores and the locks."""

    root: Path

    @classmethod
    def resolve(cls, explicit: Path | None) -> StatePaths:
        """--state-dir (or BATCHRUN_STATE_DIR), else the user's state folder."""
        root = explicit or Path(platformdirs.user_state_dir("batchrun"))
        return cls(_private_dir(root.expanduser()))

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.db"

    def run_folder(self, jobs_file: Path) -> Path:
        digest = hashlib.sha256(str(jobs_file.resolve()).encode()).hexdigest()[:16]
        return _private_dir(_private_dir(self.root / "runs") / digest)

    def run_store(self, jobs_file: Path, api: str) -> Path:
        """The run store of `jobs_file` for the API named `api` (api_fingerprint)."""
        return self.run_folder(jobs_file) / f"{api}.db"

    def stdin_copy(self, results: Path, suffix: str) -> Path:
        """Where `submit -` keeps the jobs it read from stdin: named by the results
        file, the one name a pipe's run has."""
        digest = hashlib.sha256(str(results.resolve()).encode()).hexdigest()[:16]
        return _private_dir(self.root / "stdin") / f"{digest}{suffix}"

    def run_stores(self) -> list[Path]:
        """Every run store in the state folder, of any jobs file and API."""
        return sorted((self.root / "runs").glob("*/*.db"))
