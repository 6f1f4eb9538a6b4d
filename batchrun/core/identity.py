"""Whose budget a command draws on, and which API's runs it reads: a client's identity.

A client is whoever the API limits: by default its base URL and token, named by a
hash of both (never the token itself). Tokens that share one quota (a rotated
token, sibling tokens of one account) give one `--budget-key NAME` instead, and so
draw on one budget in the ledger, named by a hash of NAME. The run store of a jobs
file is named by its API (the base URL) alone, whatever the token or budget key,
so a renewed token resumes the run.

`Identity.is_sandbox` is said by whoever builds the identity (`--sandbox`), never
guessed from how requests travel: a test double's transport is not a sandbox.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from batchrun.core.errors import UsageError

# The base URL of the sandbox served in process (`submit --sandbox`).
SANDBOX_URL = "http://sandbox.local"
_BUDGET_KEY_MAX = 100


def client_fingerprint(base_url: str, token: str | None) -> str:
    """Names a client (base URL + token) without revealing the token."""
    text = f"{base_url.rstrip('/')}\0{token or ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def budget_fingerprint(name: str) -> str:
    """Names a client by the budget it draws on (`--budget-key NAME`), whatever
    its base URL and token: rotated or sibling tokens of one quota share it."""
    text = f"budget\0{name}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def api_fingerprint(base_url: str) -> str:
    """Names an API (its base URL): the run store of a jobs file for it."""
    return hashlib.sha256(base_url.rstrip("/").encode()).hexdigest()[:16]


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    """A client: the API it talks to (None: not said), its token, the budget it
    names, and whether it is the sandbox; the budget key is checked when built.

    Raises:
        UsageError: a budget key that `check_budget_key` refuses.
    """

    base_url: str | None = None
    # Kept out of repr, so no message that shows an identity can show the token.
    token: str | None = field(default=None, repr=False)
    budget_key: str | None = None
    is_sandbox: bool = False

    def __post_init__(self) -> None:
        if self.budget_key is not None:
            check_budget_key(self.budget_key)

    @property
    def named(self) -> bool:
        """Whether the client is told apart: by a base URL or a budget key."""
        return self.base_url is not None or self.budget_key is not None

    @property
    def client(self) -> str:
        """Whose budget the requests draw on: the budget key's, else the base URL
        and token's; with neither, the one anonymous client (no URL, no token)."""
        if self.budget_key is not None:
            return budget_fingerprint(self.budget_key)
        if self.base_url is None:
            return client_fingerprint("", None)
        return client_fingerprint(self.base_url, self.token)

    @property
    def stores(self) -> tuple[str, ...]:
        """The names of the API's run store: its own, then a legacy one (of an
        earlier batchrun, named by base URL and token); none without a base URL."""
        if self.base_url is None:
            return ()
        return (
            api_fingerprint(self.base_url),
            client_fingerprint(self.base_url, self.token),
        )
