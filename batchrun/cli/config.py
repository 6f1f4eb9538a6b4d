"""The config files: what a project or a user sets once instead of on every command.

Two TOML files are read: the user's `config.toml` in their config folder
(`paths.user_config_file`), then the project's `batchrun.toml` in the current
folder, whose keys win. Flags and `BATCHRUN_*` variables win over both: the CLI
hands these values to Click as defaults (flag > env > project > user > default).
A `[limits]` table is merged key by key, under the `--limit` flags.

A file never holds a token: config files are shared, committed and backed up, so
one that names a token is refused (BATCHRUN_TOKEN, or an env file, holds it). A bad
file, an unknown key or a bad value is a usage error naming the file and the key.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from batchrun.core.errors import UsageError
from batchrun.core.identity import check_budget_key
from batchrun.core.limits import Profile, parse_override
from batchrun.run.halt import HaltPolicy
from batchrun.store.paths import user_config_file

PROJECT_FILE = "batchrun.toml"
# The variables that stand in for a flag, and so win over a file.
ENV_VARS: Mapping[str, str] = {
    "base-url": "BATCHRUN_BASE_URL",
    "ledger": "BATCHRUN_LEDGER_URL",
    "state-dir": "BATCHRUN_STATE_DIR",
}
_SECRETS = ("token", "password")

Value = str | int | Path


@dataclass(frozen=True, slots=True)
class Setting:
    """One value a config file sets, and the file it came from."""

    value: Value
    source: Path


@dataclass(frozen=True, slots=True)
class Config:
    """What the config files set: keys as written (`base-url`), limits by key."""

    files: tuple[Path, ...]
    settings: dict[str, Setting] = field(default_factory=dict)
    limits: dict[str, Setting] = field(default_factory=dict)

    def params(self) -> dict[str, Value]:
        """The settings by the name of the option they stand for (`base_url`)."""
        return {k.replace("-", "_"): s.value for k, s in self.settings.items()}

    def limit_flags(self) -> list[str]:
        """The `[limits]` table as `--limit KEY=RULE` values."""
        return [f"{key}={s.value}" for key, s in self.limits.items()]


def files(folder: Path | None = None) -> tuple[Path, ...]:
    """Where config is read, the weakest first: the user's, then the project's."""
    return (user_config_file(), (folder or Path.cwd()) / PROJECT_FILE)


def load(folder: Path | None = None) -> Config:
    """Read the config files that exist (none is fine).

    Raises:
        UsageError: a file is not TOML, holds a token, or an unknown key or bad value.
    """
    found = Config(files(folder))
    for path in found.files:
        table = _read(path)
        _check_keys(table, path)
        for key, value in table.items():
            if key == "limits":
                found.limits.update(_limits(value, path))
            else:
                found.settings[key] = Setting(_CHECKS[key](value, key, path), path)
    return found


def _read(path: Path) -> dict[str, object]:
    if not path.is_file():
        return {}
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except tomllib.TOMLDecodeError as exc:
        msg = f"{path} is not valid TOML: {exc}. Fix it, or move it away."
        raise UsageError(msg) from None
    except OSError as exc:
        msg = f"cannot read the config file {path}: {exc.strerror or exc}."
        raise UsageError(msg) from None


def _check_keys(table: Mapping[str, object], path: Path) -> None:
    for key in table:
        _refuse_secret(key, path)
        if key not in _CHECKS and key != "limits":
            raise UsageError(_unknown(key, [*_CHECKS, "limits"], path))


def _refuse_secret(key: str, path: Path) -> None:
    if any(secret in key.lower() for secret in _SECRETS):
        msg = (
            f"{path} sets {key!r}: batchrun never reads a token from a config file "
            "(it gets shared, committed and backed up). Remove it, and set "
            "BATCHRUN_TOKEN in the environment or in an env file only you can read "
            "(`cron-line --env-file`)."
        )
        raise UsageError(msg)


def _unknown(key: str, known: list[str], path: Path) -> str:
    close = difflib.get_close_matches(key.replace("_", "-"), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{path}: unknown key {key!r}{hint}; the keys are {', '.join(known)}."


def _limits(table: object, path: Path) -> dict[str, Setting]:
    if not isinstance(table, dict):
        msg = f'{path}: limits must be a table, e.g. [limits] invite = "10/5m".'
        raise UsageError(msg)
    found = {}
    for key, rule in table.items():
        _refuse_secret(key, path)
        text = f"{key}={rule}"
        try:
            if not isinstance(rule, str):
                raise UsageError(text)
            parse_override(text)
        except UsageError:
            msg = (
                f"{path}: limits.{key} = {rule!r} is not a limit: the keys are "
                'run-query, invite, avatar, global, the rules like "15/1m+500/1h".'
            )
            raise UsageError(msg) from None
        found[key] = Setting(rule, path)
    return found


def _text(value: object, key: str, path: Path) -> str:
    if not isinstance(value, str) or not value:
        msg = f'{path}: {key} must be a string, e.g. {key} = "…".'
        raise UsageError(msg)
    return value


def _profile(value: object, key: str, path: Path) -> str:
    choices = [p.value for p in Profile]
    if value not in choices:
        msg = f"{path}: profile must be one of {', '.join(choices)}, got {value!r}."
        raise UsageError(msg)
    return str(value)


def _count(value: object, key: str, path: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{path}: {key} must be a whole number of 1 or more, got {value!r}."
        raise UsageError(msg)
    return value


def _path(value: object, key: str, path: Path) -> Path:
    """A file or folder, relative to the file that names it (`~`: the home folder)."""
    return path.parent / Path(_text(value, key, path)).expanduser()


def _halt(value: object, key: str, path: Path) -> str:
    """`halt-after = 10` or `"10%"`: as --halt-after reads it."""
    # A TOML number or string reads as the flag's text; anything else fails to.
    text = value if isinstance(value, str) else repr(value)
    try:
        return str(HaltPolicy.parse(text))
    except UsageError as exc:
        msg = f"{path}: halt-after = {value!r}: {exc.message}"
        raise UsageError(msg) from None


def _budget(value: object, key: str, path: Path) -> str:
    try:
        return check_budget_key(_text(value, key, path))
    except UsageError as exc:
        msg = f"{path}: budget-key = {value!r}: {exc.message}"
        raise UsageError(msg) from None


_CHECKS: Mapping[str, Callable[[object, str, Path], Value]] = {
    "base-url": _text,
    "profile": _profile,
    "concurrency": _count,
    "ledger": _text,
    "state-dir": _path,
    "budget-key": _budget,
    "halt-after": _halt,
    "metrics-file": _path,
}


@dataclass(frozen=True, slots=True)
class InForce:
    """A setting as a command would take it with no flag: its value, and where it
    came from (a variable's name, a file, or "default")."""

    key: str
    value: str
    source: str


def in_force(
    found: Config, environ: Mapping[str, str], defaults: Mapping[str, str]
) -> list[InForce]:
    """Each setting's value and source, by precedence: env > project > user >
    default (flags, which win over all, are a command's own)."""
    rows = []
    for key in _CHECKS:
        variable = ENV_VARS.get(key, "")
        if environ.get(variable):
            rows.append(InForce(key, environ[variable], variable))
        elif key in found.settings:
            setting = found.settings[key]
            rows.append(InForce(key, str(setting.value), str(setting.source)))
        else:
            rows.append(InForce(key, defaults[key], "default"))
    return rows
