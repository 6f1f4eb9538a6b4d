"""A mixed jobs file of issue 37: the three typed jobs, requests that resolve to
them, and requests on other paths, interleaved; written the same way by the
end-to-end test and by `bench.whole_api`."""

from __future__ import annotations

import csv
import random
from pathlib import Path

HEADER = ["id", "type", "team_id", "payload", "method", "path"]
TEAMS = ("acme", "beta", "gamma")


def _row(
    job_id: str, kind: str, n: int, payload: str, method: str, path: str
) -> list[str]:
    return [job_id, kind, TEAMS[n % len(TEAMS)], payload, method, path]


def mixed_rows(
    *, queries: int, invites: int, resolving: int, others: int, seed: int = 37
) -> list[list[str]]:
    """`queries` run-query and `invites` invite jobs; `resolving` POST requests to
    run-query's and invite's paths, half each; `others` GET and DELETE requests
    on other paths (one DELETE in three); shuffled with `seed`."""
    rows = [_row(f"q{n}", "run-query", n, "{}", "", "") for n in range(queries)]
    for n in range(invites):
        rows.append(
            _row(f"i{n}", "invite", n, f'{{"email": "u{n}@x.example"}}', "", "")
        )
    for n in range(resolving):
        where = "data/run-query" if n % 2 == 0 else "members/invite"
        rows.append(
            _row(f"r{n}", "request", n, "{}", "POST", f"/teams/{{team_id}}/{where}")
        )
    for n in range(others):
        if n % 3 == 2:
            path = f"/teams/{{team_id}}/members/m{n}"
            rows.append(_row(f"d{n}", "request", n, "", "DELETE", path))
        else:
            path = f"/teams/{{team_id}}/reports?page={n}"
            rows.append(_row(f"g{n}", "request", n, "", "GET", path))
    random.Random(seed).shuffle(rows)
    return rows


def write_mixed(path: Path, **counts: int) -> Path:
    """Write `mixed_rows(**counts)` as a CSV jobs file at `path`."""
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(HEADER)
        writer.writerows(mixed_rows(**counts))
    return path
