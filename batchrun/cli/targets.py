"""Where `submit` sends, from its flags: the in-process sandbox (with the rules,
faults and headers the `--server-*` flags give it) or a checked `--base-url`.

A bad URL, a bad CA bundle, sandbox-only flags without `--sandbox`, or a scaled
time against a real API are usage errors (exit 2) before anything is sent. The
sandbox and httpx are imported only when a target is built.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from batchrun.core.errors import UsageError
from batchrun.core.limits import LimitKey, Rule
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.policy_headers import HeaderStyle

if TYPE_CHECKING:
    from batchrun.run.wiring import Target


@dataclass(frozen=True, slots=True)
class Server:
    """What `submit` says about the in-process sandbox: whether to use it, the
    rules it enforces (the client's, with `--server-limit` on top) and how."""

    sandbox: bool
    rules: dict[LimitKey, Rule]
    inject: list[str] | None
    limits: list[str] | None
    counting: LimiterKind | None
    headers: HeaderStyle | None
    burst: int | None = None

    def check(self) -> None:
        """Sandbox-only flags without --sandbox are a usage error."""
        given = {
            "--inject": self.inject,
            "--server-limit": self.limits,
            "--server-counting": self.counting,
            "--server-headers": self.headers,
            "--server-burst": self.burst,
        }
        named = [flag for flag, value in given.items() if value]
        if named and not self.sandbox:
            verb = "works" if len(named) == 1 else "work"
            msg = f"{', '.join(named)} only {verb} with --sandbox."
            raise UsageError(msg)


def target(
    base_url: str | None,
    token: str | None,
    timeout: float,
    server: Server,
    ca_bundle: Path | None,
    warn: Callable[[str], None],
) -> Target:
    """Where submit sends: the in-process sandbox, or the checked --base-url
    (a missing token for a remote host is warned about, not refused)."""
    from batchrun.run.wiring import Target

    server.check()
    if server.sandbox:
        return _sandbox_target(server, token, timeout, ca_bundle)
    if not base_url:
        msg = "No API to talk to: give --base-url (or BATCHRUN_BASE_URL), or --sandbox."
        raise UsageError(msg)
    check_base_url(base_url, warn, token=bool(token))
    _check_ca_bundle(ca_bundle)
    return Target(base_url=base_url, token=token, timeout=timeout, ca_bundle=ca_bundle)


def _sandbox_target(
    server: Server, token: str | None, timeout: float, ca_bundle: Path | None
) -> Target:
    """The sandbox served in process, through an ASGI transport."""
    from batchrun.api.client import asgi_transport
    from batchrun.run.wiring import Target
    from batchrun.sandbox import faults
    from batchrun.sandbox.app import create_app

    app = create_app(
        rules=server.rules,
        faults=faults.parse_faults(server.inject or []),
        counting=server.counting or LimiterKind.SLIDING,
        headers=server.headers or HeaderStyle.NONE,
        burst=server.burst or 0,
    )
    _check_ca_bundle(ca_bundle)
    return Target(
        base_url="http://sandbox.local",
        token=token,
        timeout=timeout,
        transport=asgi_transport(app),
        ca_bundle=ca_bundle,
    )


def check_time_scale(time_scale: float, *, sandbox: bool, base_url: str | None) -> None:
    """Scaling a real API's windows would multiply its limits: only the sandbox,
    in process or on loopback (`batchrun sandbox --time-scale N`), is scaled."""
    host = urlsplit(base_url or "").hostname or ""
    if time_scale != 1 and not sandbox and not _is_loopback(host):
        msg = (
            f"--time-scale {time_scale:g} only works with --sandbox or a sandbox on "
            f"loopback: against a real API it would send {time_scale:g} times "
            "faster than its limits allow."
        )
        raise UsageError(msg)


def _check_ca_bundle(ca_bundle: Path | None) -> None:
    """A bad bundle exits 2 before anything starts."""
    from batchrun.api.client import tls_context

    if ca_bundle is not None:
        tls_context(ca_bundle)


def check_base_url(
    url: str, warn: Callable[[str], None], *, token: bool = True
) -> None:
    """An http(s) URL with a host and no credentials. For a host that is not
    loopback, one warning: no token, or a token that would travel in clear."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        msg = f"--base-url must be an http:// or https:// URL with a host, got {url!r}."
        raise UsageError(msg)
    if parts.username or parts.password:
        msg = (
            "--base-url must not hold credentials; pass the token with BATCHRUN_TOKEN."
        )
        raise UsageError(msg)
    host = parts.hostname
    if _is_loopback(host):
        return
    if not token:
        how = " over plain http://" if parts.scheme == "http" else ""
        warn(
            f"no token for {host} (BATCHRUN_TOKEN or --token): requests go{how} "
            "without Authorization."
        )
    elif parts.scheme == "http":
        warn(
            f"{host} is reached over plain http://: the token travels unencrypted. "
            "Use https://."
        )


def _is_loopback(host: str) -> bool:
    """localhost, or a loopback IP address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
