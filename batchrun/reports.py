"""What `validate`, `status` and `plan` print: lines of text, or JSON for scripts.

Pure rendering of values computed elsewhere (`jobs.Summary`, `overview.Status`,
`overview.KeyPlan`); the CLI only echoes what these return.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from batchrun import durations

if TYPE_CHECKING:
    # Types only: `status` and `plan` import overview when they run, so that
    # `--help` and `validate` do not load SQLite.
    from batchrun.jobs import Summary
    from batchrun.limits import LimitKey
    from batchrun.overview import KeyLimit, KeyPlan, Status
    from batchrun.state import Failure

_TEAMS_SHOWN = 10
_UNKNOWN_HINT = (
    "the server may or may not have processed these; check, then resend "
    "them with --retry-unknown (--retry-failed does not)"
)


def summary_lines(jobs_file: Path, summary: Summary) -> list[str]:
    """`validate`: how many valid jobs of each type, and the busiest teams."""
    per_type = ", ".join(f"{kind.value} {n}" for kind, n in summary.per_type.items())
    lines = [f"{jobs_file}: {summary.total} valid job(s): {per_type or 'none'}"]
    if summary.per_team:
        teams = sorted(summary.per_team.items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{team} {n}" for team, n in teams[:_TEAMS_SHOWN])
        more = (
            f" and {len(teams) - _TEAMS_SHOWN} more"
            if len(teams) > _TEAMS_SHOWN
            else ""
        )
        lines.append(f"  {len(teams)} team(s): {shown}{more}")
    return lines


def status_lines(jobs_file: Path, found: Status) -> list[str]:
    """`status`: counts per endpoint and state, failures, then the time left."""
    if found.store is None:
        return [f"{jobs_file}: no run yet."]
    lines = []
    for key, states in found.states.items():
        counts = ", ".join(f"{n} {state.value}" for state, n in states.items())
        lines.append(f"{key.value}: {counts}")
    for failure in found.failures:
        lines.append(
            f"  {failure.state}: {failure.id} ({failure.type}): {failure.error}"
        )
    if any(failure.state == "unknown" for failure in found.failures):
        lines.append(f"  unknown: {_UNKNOWN_HINT}")
    return lines + plan_lines(found.keys)


def plan_lines(plans: list[KeyPlan]) -> list[str]:
    """`plan`: per endpoint, the jobs left, the rule, the budget in use and the time."""
    lines = []
    for item in plans:
        used = ", ".join(f"{n} of {window}" for window, n in item.used)
        learned = " (learned)" if item.learned else ""
        lines.append(
            f"{item.jobs:,} {item.key.value} jobs at {item.rule}{learned}: "
            f"{durations.spoken(item.seconds)} (in use now: {used})"
        )
    if len(plans) > 1:
        longest = max(item.seconds for item in plans)
        lines.append(f"all: {durations.spoken(longest)}")
    return lines


def status_json(jobs_file: Path, found: Status) -> dict[str, object]:
    """`status --json`: the same as `status_lines`, as one object."""
    return {
        "file": str(jobs_file),
        "states": {
            k.value: {s.value: n for s, n in v.items()} for k, v in found.states.items()
        },
        "failures": [_failure_json(f) for f in found.failures],
        "keys": [_plan_json(p) for p in found.keys],
    }


def _plan_json(plan: KeyPlan) -> dict[str, object]:
    return {
        "key": plan.key.value,
        "jobs_left": plan.jobs,
        "rule": str(plan.rule),
        "learned": plan.learned,
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


def limits_lines(found: list[KeyLimit], forgotten: list[LimitKey]) -> list[str]:
    """`limits`: per key, the rule in force and, if learned, when and why."""
    lines = [f"Forgot what was learned of {key.value}'s limit." for key in forgotten]
    for item in found:
        if item.learned is None and item.rule != item.given:
            until = f"until the server shows {item.given} holds (--profile auto)"
            lines.append(f"{item.key.value}: {item.rule}, {until}")
            continue
        if item.learned is None:
            lines.append(f"{item.key.value}: {item.rule}")
            continue
        spread = ", evenly spaced" if item.spread else ""
        lines.append(f"{item.key.value}: {item.rule}{spread} (given {item.given})")
        lines.append(f"  {item.learned}")
    if any(item.learned for item in found):
        lines.append("`batchrun limits --forget KEY` starts KEY from its given rule.")
    return lines


def limits_json(found: list[KeyLimit]) -> dict[str, object]:
    """`limits --json`: the same as `limits_lines`, as one object."""
    return {
        item.key.value: {
            "rule": str(item.rule),
            "given": str(item.given),
            "spread": item.spread,
            "learned": item.learned,
        }
        for item in found
    }
