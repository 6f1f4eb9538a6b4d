"""Whose budget a command draws on, and where an API's runs are kept.

A client is whoever the API limits: by default its base URL and token, named by
a hash of both (`store.paths.client_fingerprint`; never the token). Tokens that
share one quota (a rotated token, sibling tokens of one account) give one
`--budget-key NAME` instead, and so draw on one budget in the ledger, named by a
hash of NAME. The run store of a jobs file is named by its API (the base URL)
alone, whatever the token or budget key.
"""

from __future__ import annotations

from batchrun.core.errors import UsageError
from batchrun.store.paths import (
    api_fingerprint,
    budget_fingerprint,
    check_budget_key,
    client_fingerprint,
)


def budget_key(name: str | None) -> str | None:
    """--budget-key NAME, checked; None without it."""
    return None if name is None else check_budget_key(name)


def stores(base_url: str | None, token: str | None) -> tuple[str, ...]:
    """The names of the run store of an API: its own, then a legacy one (of an
    earlier batchrun, named by base URL and token); none without a base URL."""
    if base_url is None:
        return ()
    return (api_fingerprint(base_url), client_fingerprint(base_url, token))


def client(
    base_url: str | None, token: str | None, budget: str | None = None
) -> str | None:
    """The client's fingerprint: its --budget-key's, else its base URL and
    token's (None without either)."""
    if budget is not None:
        return budget_fingerprint(check_budget_key(budget))
    return None if base_url is None else client_fingerprint(base_url, token)


def learning_client(
    base_url: str | None, token: str | None, budget: str | None = None
) -> str:
    """The client whose limits `limits` shows: it needs a base URL or a
    --budget-key."""
    found = client(base_url, token, budget)
    if found is None:
        msg = (
            "limits are learned per client: give its --base-url "
            "(or BATCHRUN_BASE_URL) and its token, or its --budget-key"
        )
        raise UsageError(msg)
    return found
