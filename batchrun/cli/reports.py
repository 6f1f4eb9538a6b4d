"""What `validate`, `status`, `plan` and `config` print: lines, or JSON for scripts.

Pure rendering of values computed elsewhere (`jobs.Summary`, `read_model.StatusReport`,
`read_model.KeyPlan`); the CLI only echoes what these return.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from batchrun.cli.board import response_lines
from batchrun.cli.news import kept_text
from batchrun.core import durations, events
from batchrun.core.responses import PERCENTILES, Responses

if TYPE_CHECKING:
    # Types only: `status` and `plan` import the read model when they run, so that
    # `--help` and `validate` do not load SQLite.
    from batchrun.cli.config import InForce
    from batchrun.core.errors import JobsFileError
    from batchrun.core.limits import LimitKey, Rule
    from batchrun.jobs.job import Summary
    from batchrun.query.read_model import KeyLimit, KeyPlan, Shown, StatusReport
    from batchrun.store.state import Failure, Reason

_TEAMS_SHOWN = 10
_UNKNOWN_HINT = (
    "the server may or may not have processed these; check, then resend "
    "them with --retry-unknown (--retry-failed does not)"
)


def summary_lines(jobs_file: Path, summary: Summary) -> list[str]:
    """`validate`: how many valid jobs of each type, and the busiest teams."""
    per_type = ", ".join(f"{kind.value} {n:,}" for kind, n in summary.per_type.items())
    lines = [f"{jobs_file}: {summary.total:,} valid job(s): {per_type or 'none'}"]
    # Typed jobs draw on the budget of their own name; requests on any.
    if any(kind.value == "request" for kind in summary.per_type):
        lines.append(f"  budgets: {_budgets(summary)}")
    if summary.per_team:
        teams = sorted(summary.per_team.items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{team} {n:,}" for team, n in teams[:_TEAMS_SHOWN])
        more = (
            f" and {len(teams) - _TEAMS_SHOWN:,} more"
            if len(teams) > _TEAMS_SHOWN
            else ""
        )
        lines.append(f"  {len(teams):,} team(s): {shown}{more}")
    return lines


def _budgets(summary: Summary) -> str:
    """Each budget the jobs draw on and which types draw on it:
    `run-query 70 (run-query 60, request 10), global 100 (request)`."""
    parts = []
    for key, types in summary.per_budget.items():
        total = sum(types.values())
        if len(types) == 1:
            [kind] = types
            parts.append(f"{key.value} {total} ({kind.value})")
        else:
            each = ", ".join(f"{kind.value} {n}" for kind, n in types.items())
            parts.append(f"{key.value} {total} ({each})")
    return ", ".join(parts)


def summary_json(jobs_file: Path, summary: Summary) -> dict[str, object]:
    """`validate --json` of a good file: the counts per type, per budget (and
    the types drawing on each) and per team."""
    return {
        "file": str(jobs_file),
        "valid": True,
        "jobs": summary.total,
        "per_type": {kind.value: n for kind, n in summary.per_type.items()},
        "per_budget": {
            key.value: {kind.value: n for kind, n in types.items()}
            for key, types in summary.per_budget.items()
        },
        "per_team": dict(sorted(summary.per_team.items())),
    }


def problems_json(error: JobsFileError) -> dict[str, object]:
    """`validate --json` of a bad file: every problem kept, by line (0: the file)."""
    return {
        "file": error.path,
        "valid": False,
        "invalid_rows": error.total,
        "problems": [{"line": line, "reason": why} for line, why in error.problems],
    }


def plan_json(jobs_file: Path, plans: list[KeyPlan]) -> dict[str, object]:
    """`plan --json`: `plan_lines` as one object; `eta_seconds` is the longest."""
    return {
        "file": str(jobs_file),
        "keys": [_plan_json(p) for p in plans],
        "eta_seconds": round(max((p.seconds for p in plans), default=0.0), 3),
    }


def nothing_left(failed: int, unknown: int) -> str:
    """`plan` with no job left to send: and those a rerun sends only if asked."""
    asked = [
        f"{failed:,} failed (--retry-failed sends them again)" if failed else "",
        f"{unknown:,} unknown (--retry-unknown sends them again)" if unknown else "",
    ]
    said = "; ".join(text for text in asked if text)
    return f"Nothing to send: {said}." if said else "Nothing to send."


def auto_line(fallback: dict[LimitKey, Rule], statement_a: dict[LimitKey, Rule]) -> str:
    """What `--profile auto` assumes, under the plan."""
    said = ", ".join(
        f"{key.value} at {rule} (statement b) until the service shows it enforces "
        f"{statement_a[key]} (statement a)"
        for key, rule in fallback.items()
    )
    return (
        f"--profile auto plans {said}: a run finds out, spending at most one 429 "
        "per window probed, and is then faster."
    )


def status_lines(jobs_file: Path, found: StatusReport) -> list[str]:
    """`status`: counts per endpoint and state, failures, then the time left."""
    lines = []
    for key, states in found.states.items():
        counts = ", ".join(f"{n} {state.value}" for state, n in states.items())
        lines.append(f"{key.value}: {counts}")
    lines += [_reason_line(reason) for reason in found.reasons]
    if sum(reason.count for reason in found.reasons) < _ended_badly(found):
        lines.append("  … and more reasons (--json --show all lists every job)")
    if any(reason.state is events.Status.UNKNOWN for reason in found.reasons):
        lines.append(f"  unknown: {_UNKNOWN_HINT}")
    answers = [f"latest run: {line}" for line in response_lines(found.responses)]
    return lines + answers + _activity_lines(found) + plan_lines(found.keys)


def _reason_line(reason: Reason) -> str:
    """One reason jobs failed: how many, why, and the first ids."""
    more = reason.count - len(reason.ids)
    ids = ", ".join(reason.ids) + (f" and {more:,} more" if more else "")
    error = reason.error or "no error recorded"
    return f"  {reason.count:,} {reason.state}: {error} ({ids})"


def _ended_badly(found: StatusReport) -> int:
    """How many jobs of the run are failed or unknown."""
    bad = (events.Status.FAILED, events.Status.UNKNOWN)
    return sum(n for s in found.states.values() for st, n in s.items() if st in bad)


def _activity_lines(found: StatusReport) -> list[str]:
    act = found.activity
    if act is None:
        return []
    lines = ["a run is working on it now" if act.active else "no run is working on it"]
    if act.started_at is not None:
        lines.append(f"latest run started {_when(act.started_at)}")
    if act.last_activity is not None:
        lines.append(f"last activity {_when(act.last_activity)}")
    if act.results is not None:
        lines.append(f"results: {act.results}")
    return lines


def _when(stamp: float) -> str:
    return datetime.fromtimestamp(stamp).astimezone().strftime("%Y-%m-%d %H:%M:%S %z")


def _requests(item: KeyPlan) -> str:
    """Which of a key's jobs are request jobs drawing on its budget."""
    if not item.requests:
        return ""
    if item.requests == item.jobs:
        return " (requests)"
    return f" ({item.requests:,} of them requests)"


def plan_lines(plans: list[KeyPlan]) -> list[str]:
    """`plan`: per endpoint, the jobs left, the rule, the budget in use and the time."""
    lines = []
    for item in plans:
        used = ", ".join(f"{n} of {window}" for window, n in item.used)
        learned = " (learned)" if item.learned else ""
        lines.append(
            f"{item.jobs:,} {item.key.value} jobs{_requests(item)} at "
            f"{item.rule}{learned}: "
            f"{durations.spoken(item.seconds)} (in use now: {used})"
        )
    if len(plans) > 1:
        longest = max(item.seconds for item in plans)
        lines.append(f"all: {durations.spoken(longest)}")
    return lines


def status_json(jobs_file: Path, found: StatusReport) -> dict[str, object]:
    """`status --json`: the same as `status_lines`, as one object."""
    return {
        "file": str(jobs_file),
        "states": {
            k.value: {s.value: n for s, n in v.items()} for k, v in found.states.items()
        },
        "failures": [_failure_json(f) for f in found.failures],
        "failures_total": _ended_badly(found),
        "reasons": [
            {"state": r.state, "error": r.error, "count": r.count, "ids": r.ids}
            for r in found.reasons
        ],
        "responses": _responses_json(found.responses),
        **_activity_json(found),
        "keys": [_plan_json(p) for p in found.keys],
    }


def _responses_json(responses: Responses) -> dict[str, object]:
    """The latest run's answers per endpoint: counts by code, and latency
    percentiles in seconds (None without an answer)."""
    found: dict[str, object] = {}
    for key, answers in responses.keys.items():
        latency = answers.latency
        timed = {f"p{p:g}": latency.percentile(p) for p in PERCENTILES}
        found[key.value] = {
            "codes": dict(answers.ordered()),
            "latency": {**timed, "max": latency.max if latency.count else None},
        }
    return found


def _activity_json(found: StatusReport) -> dict[str, object]:
    act = found.activity
    return {
        "active": act is not None and act.active,
        "results": None if act is None else act.results,
        "started_at": None if act is None else act.started_at,
        "last_activity": None if act is None else act.last_activity,
    }


def _plan_json(plan: KeyPlan) -> dict[str, object]:
    return {
        "key": plan.key.value,
        "jobs_left": plan.jobs,
        "requests_left": plan.requests,
        "rule": plan.rule.grammar,
        "burst": plan.rule.burst,
        "learned": None if plan.learned is None else kept_text(plan.learned),
        "in_use": dict(plan.used),
        "eta_seconds": round(plan.seconds, 3),
    }


def _failure_json(failure: Failure) -> dict[str, str]:
    return {
        "id": failure.id,
        "type": failure.type,
        "state": failure.state,
        "error": failure.error,
    }


def limits_lines(
    found: list[KeyLimit], asked: list[LimitKey], forgotten: list[LimitKey]
) -> list[str]:
    """`limits`: what --forget did (of the keys `asked`, those `forgotten`), then
    per key the rule in force and, if learned, when and why."""
    lines = [f"Forgot what was learned of {key.value}'s limit." for key in forgotten]
    if asked and not forgotten:
        names = ", ".join(key.value for key in asked)
        lines.append(f"Nothing was learned of {names}: nothing to forget.")
    for item in found:
        lines += _limit_lines(item)
    if any(item.learned for item in found):
        lines.append("`batchrun limits --forget KEY` starts KEY from its given rule.")
    return lines


def _limit_lines(item: KeyLimit) -> list[str]:
    """One key of `limits`: its rule, and what was learned of its server."""
    if item.learned is None and item.rule != item.given:
        until = f"until the server shows {item.given} holds (--profile auto)"
        lines = [f"{item.key.value}: {item.rule}, {until}"]
    elif item.learned is None:
        lines = [f"{item.key.value}: {item.rule}"]
    else:
        spread = ", evenly spaced" if item.spread else ""
        lines = [f"{item.key.value}: {item.rule}{spread} (given {item.given})"]
        lines.append(f"  {kept_text(item.learned)}")
        if item.until is not None:
            lines.append(f"  kept until {_minute(item.until)}, then tested again")
    return lines


def _minute(moment: float) -> str:
    return datetime.fromtimestamp(moment).strftime("%Y-%m-%d %H:%M")


def limits_json(found: list[KeyLimit]) -> dict[str, object]:
    """`limits --json`: the same as `limits_lines`, as one object."""
    return {
        item.key.value: {
            "rule": item.rule.grammar,
            "burst": item.rule.burst,
            "given": str(item.given),
            "spread": item.spread,
            "learned": None if item.learned is None else kept_text(item.learned),
            "until": item.until,
        }
        for item in found
    }


def show_json(shown: Shown) -> dict[str, object]:
    """`show --json`: the job's state in the run store and its last results line."""
    job = shown.job
    return {
        "id": job.id,
        "line": job.line,
        "type": job.type,
        "state": job.state.value,
        "attempts": job.attempts,
        "http_status": job.http_status,
        "error": job.error,
        "result": shown.result,
    }


def show_lines(shown: Shown) -> list[str]:
    """`show`: one field a line, then the results line's response, if any."""
    fields = show_json(shown)
    result = fields.pop("result")
    lines = [
        f"{name}: {'' if value is None else value}" for name, value in fields.items()
    ]
    if isinstance(result, dict):
        lines.append(f"response: {json.dumps(result.get('response'))}")
        finished = result.get("finished_at")
        if isinstance(finished, int | float):
            lines.append(
                f"finished: {datetime.fromtimestamp(finished):%Y-%m-%d %H:%M:%S}"
            )
    else:
        lines.append("response: (no line in the results file)")
    return lines


def config_lines(
    settings: list[InForce],
    limits: list[InForce],
    token: str | None,
    files: tuple[Path, ...],
) -> list[str]:
    """`config`: each setting in force and where it came from; never the token."""
    lines = [_config_row(row) for row in settings]
    lines.append("limits:")
    lines += [f"  {_config_row(row)}" for row in limits]
    said = f"set in {token} (never shown)" if token else "not set (BATCHRUN_TOKEN)"
    lines.append(f"{'token':<12} {said}")
    read = ", ".join(f"{p}{'' if p.is_file() else ' (none)'}" for p in files)
    lines.append(f"config files: {read}")
    lines.append("A flag given to a command wins over all of these.")
    return lines


def _config_row(row: InForce) -> str:
    return f"{row.key:<12} {row.value:<30} {row.source}"


# The settings whose value is a number: --json gives it as one.
_NUMBERS = frozenset({"concurrency"})


def _json_value(row: InForce) -> object:
    """A number as a number, where the setting is one (a bad variable's text as is)."""
    if row.key in _NUMBERS and row.value.strip().isdigit():
        return int(row.value)
    return row.value


def config_json(
    settings: list[InForce],
    limits: list[InForce],
    token: str | None,
    files: tuple[Path, ...],
) -> dict[str, object]:
    """`config --json`: the same, for scripts (the token: where it is set, if so)."""
    return {
        "settings": {
            r.key: {"value": _json_value(r), "source": r.source} for r in settings
        },
        "limits": {r.key: {"value": r.value, "source": r.source} for r in limits},
        "token": {"set": token is not None, "source": token},
        "files": [{"path": str(p), "found": p.is_file()} for p in files],
    }
