"""What the config files make of the defaults: Click's default_map for each
command, and the settings and limits in force with no flag, each with where it
came from (`batchrun config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from batchrun.cli import arguments, config
from batchrun.core.limits import LimitKey, Profile

# --concurrency's default, which `config` shows too: none, as the limits need
# (`run.settings.in_flight_cap`).
CONCURRENCY: int | None = None
CONCURRENCY_SHOWN = "as the limits need (8-64)"
# `batchrun sandbox --port`'s default: not 8000, which `mkdocs serve` and many
# development servers take.
SANDBOX_PORT = 8765


def _shown_defaults() -> dict[str, str]:
    """The defaults `config` shows for the settings no source sets."""
    return {
        "base-url": "(none)",
        "profile": Profile.B.value,
        "concurrency": CONCURRENCY_SHOWN,
        "ledger": "SQLite in the state folder",
        "state-dir": str(arguments.resolve(state_dir=None).state.root),
        "budget-key": "(base URL + token)",
        "halt-after": "(none: every job is tried)",
        "metrics-file": "(none)",
    }


def limits_in_force(found: config.Config, profile: Profile) -> list[config.InForce]:
    """Each key's rule with no --limit, and where it came from."""
    given = arguments.resolve(
        state_dir=None, profile=profile, limit=found.limit_flags()
    )
    table = given.limits.rules
    return [
        config.InForce(key.value, str(table[key]), _limit_source(found, key, profile))
        for key in LimitKey
    ]


def _limit_source(found: config.Config, key: LimitKey, profile: Profile) -> str:
    """The config file that set a key's rule, else its profile or the default."""
    if key.value in found.limits:
        return str(found.limits[key.value].source)
    return f"profile {profile.value}" if key is LimitKey.RUN_QUERY else "default"


# Serves limits of its own: the client's config does not make the server.
_UNCONFIGURED = frozenset({"sandbox"})


def config_defaults(found: config.Config, group: object) -> dict[str, Any]:
    """Click's default_map: for each command, the options the config files set.
    Click reads it after the command line and the envvar, so flags and
    BATCHRUN_* win over the files."""
    values = found.params()
    commands: dict[str, Any] = getattr(group, "commands", {})
    return {
        name: {p.name: values[p.name] for p in command.params if p.name in values}
        for name, command in commands.items()
        if name not in _UNCONFIGURED
    }


def settings_in_force(
    found: config.Config, environ: Mapping[str, str]
) -> list[config.InForce]:
    """The settings no flag gives, and where each came from; URLs redacted."""
    from batchrun.ledgers.redis_ledger import redacted

    return [
        replace(row, value=redacted(row.value))
        if row.key in ("base-url", "ledger")
        else row
        for row in config.in_force(found, environ, _shown_defaults())
    ]
