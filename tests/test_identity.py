"""A client's identity: its fingerprints, its run stores, and whether it is the sandbox."""

from __future__ import annotations

import httpx
import pytest

from batchrun.cli.arguments import resolve
from batchrun.core.errors import UsageError
from batchrun.core.identity import (
    SANDBOX_URL,
    Identity,
    api_fingerprint,
    budget_fingerprint,
    client_fingerprint,
)
from batchrun.run.wiring import Target

URL = "https://api.example.test"


def test_a_test_doubles_transport_is_not_a_sandbox():
    """A target sending through an injected transport is the client it names:
    being the sandbox is said (`--sandbox`), not guessed from the transport."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    target = Target(identity=Identity(base_url=URL), timeout=1.0, transport=transport)
    assert not target.identity.is_sandbox


def test_sandbox_is_said_by_the_flag():
    """`--sandbox` makes the client the sandbox served in process, whatever
    --base-url says."""
    identity = resolve(state_dir=None, base_url=URL, sandbox=True).identity
    assert identity.is_sandbox
    assert identity.base_url == SANDBOX_URL


@pytest.mark.parametrize(
    ("identity", "expected"),
    [
        pytest.param(
            Identity(base_url=URL, token="tok"),
            client_fingerprint(URL, "tok"),
            id="url-and-token",
        ),
        pytest.param(
            Identity(base_url=URL, token="tok", budget_key="prod"),
            budget_fingerprint("prod"),
            id="budget-key-wins",
        ),
        pytest.param(
            Identity(token="tok"),
            client_fingerprint("", None),
            id="anonymous-ignores-a-lone-token",
        ),
    ],
)
def test_whose_budget(identity, expected):
    """The budget key names the client, else its base URL and token; with
    neither, the one anonymous client."""
    assert identity.client == expected


def test_the_run_stores_are_the_apis_then_the_legacy_clients():
    """An API's run store is named by its base URL, then by an earlier batchrun's
    name (base URL and token); with no base URL, by nothing."""
    assert Identity(base_url=URL, token="t").stores == (
        api_fingerprint(URL),
        client_fingerprint(URL, "t"),
    )
    assert Identity(token="t").stores == ()


def test_a_bad_budget_key_is_refused_when_built():
    """A budget key with a control character is a usage error at once."""
    with pytest.raises(UsageError, match="--budget-key must be a name"):
        Identity(base_url=URL, budget_key="a\tb")


def test_a_target_needs_a_base_url():
    """A target sends somewhere: an identity with no base URL is refused."""
    with pytest.raises(ValueError, match="base URL"):
        Target(identity=Identity(), timeout=1.0)


def test_the_token_is_not_in_the_repr():
    """No message that shows an identity shows its token."""
    assert "SECRET" not in repr(Identity(base_url=URL, token="tok-SECRET"))
