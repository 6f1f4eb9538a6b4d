"""The cases of issue 24's table: what the client is told, what the server does.

Each `Case` is one row: the rule the client is told and the rule the server
enforces (both at bench scale: 30/2s stands for 30/60s), the number of run-query
jobs, and what the server adds (`case_server.Behaviour`: an answer latency, no
Retry-After, injected 429s for a while; rate-limit headers), or a stock slowapi
server in its place (`support.slowapi_server`, with the same log). A case that
`follows` another runs right after it with the same client state (the same state
folder for batchrun) against a fresh, quiet server.

`ideal` is the makespan a perfect client would reach: it knows the server's true
rule and sends each job at the first millisecond the server's sliding windows
accept it (`oracles.SlidingLog`), never refused; its last answer comes `latency`
after its last send. Injected faults are not part of the rule: a stray 429 spends
a slot, so no client can reach the ideal in that row.

`case_server` starts a case's fresh server, `chains` orders the cases to run
(each after the one it follows), and `summarize` reads one run's figures from the
server's log: what bench/against_scripts.py measures, and tests/ check.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

from batchrun.core.limits import LimitKey, Rule, parse_rule
from batchrun.sandbox.faults import Faults
from batchrun.sandbox.policy_headers import HeaderStyle
from support import oracles
from support.case_server import Behaviour, Recorder, Served, serving

# The bench's windows are the real ones divided by this: 30/2s stands for 30/60s.
SCALE = 30


@dataclass(frozen=True, slots=True)
class Case:
    """One row of the table."""

    number: int
    title: str
    told: str
    server: str
    jobs: int
    behaviour: Behaviour = field(default_factory=Behaviour)
    stray_429: float = 0.0
    headers: HeaderStyle = HeaderStyle.NONE
    follows: int | None = None
    # The server: the sandbox (`case_server`), or stock slowapi (`slowapi_server`).
    limiter: Literal["sandbox", "slowapi"] = "sandbox"

    @property
    def told_rule(self) -> Rule:
        return parse_rule(self.told)

    @property
    def server_rule(self) -> Rule:
        return parse_rule(self.server)

    def rules(self) -> dict[LimitKey, Rule]:
        """The server's rules: run-query only (every other key unlimited)."""
        return {LimitKey.RUN_QUERY: self.server_rule}

    def faults(self, seed: int) -> Faults:
        """The sandbox's injected faults: stray 429s, drawn from `seed`."""
        return Faults(rate_429=self.stray_429, seed=seed)

    def ideal(self) -> float:
        """Seconds from a perfect client's first send to its last answer."""
        windows = [(w.count, round(w.seconds * 1000)) for w in self.server_rule.windows]
        return oracles.makespan(oracles.SlidingLog(windows), self.jobs) + (
            self.behaviour.latency
        )


CASES = (
    Case(1, "right rule 30/2s, 120 jobs", "30/2s", "30/2s", 120),
    Case(
        2,
        "right rule, the server answers 100 ms after each arrival",
        "30/2s",
        "30/2s",
        120,
        Behaviour(latency=0.1),
    ),
    Case(
        3, "told 30/2s, server 10/2s, Retry-After sent, 60 jobs", "30/2s", "10/2s", 60
    ),
    Case(
        4,
        "same, no Retry-After",
        "30/2s",
        "10/2s",
        60,
        Behaviour(retry_after=False),
    ),
    Case(
        5,
        "right rule, 5 % of accepted requests answered 429 for 14 s",
        "30/2s",
        "30/2s",
        120,
        Behaviour(faults_for=14.0),
        stray_429=0.05,
    ),
    Case(
        6,
        "the next run with the same client, the server quiet again",
        "30/2s",
        "30/2s",
        120,
        follows=5,
    ),
    Case(
        7,
        "profile a against a b-shaped server (told 30/4s, server 15/4s+60/20s), "
        "90 jobs",
        "30/4s",
        "15/4s+60/20s",
        90,
    ),
    Case(
        8,
        "policy headers stated (IETF RateLimit), told 30/2s, server 10/2s, 60 jobs",
        "30/2s",
        "10/2s",
        60,
        headers=HeaderStyle.IETF,
    ),
    Case(
        9,
        "right rule, stock slowapi (moving window) answering 40 ms after each arrival",
        "30/2s",
        "30/2s",
        120,
        Behaviour(latency=0.04),
        limiter="slowapi",
    ),
    Case(
        10,
        "right rule, every request answered 429 (no Retry-After) for 0.2 s from "
        "20 ms after the first arrival (a gateway's outage)",
        "30/2s",
        "30/2s",
        120,
        Behaviour(retry_after=False, faults_for=0.2, faults_from=0.02),
        stray_429=1.0,
    ),
    Case(
        11,
        "the next run with the same client, the server quiet again",
        "30/2s",
        "30/2s",
        120,
        follows=10,
    ),
)


def case_server(case: Case, round_: int) -> AbstractContextManager[Recorder]:
    """The case's fresh server: the sandbox, or stock slowapi (imported only
    then: slowapi is in the bench extra, not the test one)."""
    if case.limiter == "slowapi":
        from support import slowapi_server

        return slowapi_server.serving(case.server, case.behaviour)
    faults = case.faults(seed=7 + round_)
    return serving(case.rules(), case.behaviour, faults=faults, headers=case.headers)


def summarize(
    case: Case,
    tool: str,
    log: list[Served],
    round_: int,
    stalled: bool,
    code: int,
) -> dict[str, Any]:
    """Figures of one run from the server's log: 429s, acceptance, makespan."""
    accepted = [s for s in log if 200 <= s.status < 300]
    first = min((s.at for s in log), default=0.0)
    makespan = max((s.answered for s in accepted), default=first) - first
    keys = {s.idempotency_key for s in accepted}
    return {
        "case": case.number,
        "tool": tool,
        "round": round_,
        "jobs": case.jobs,
        "requests": len(log),
        "http_429": sum(s.status == 429 for s in log),
        "other": sum(not (200 <= s.status < 300 or s.status == 429) for s in log),
        "accepted": len(accepted),
        "exactly_once": len(accepted) == len(keys) == case.jobs,
        "stalled": stalled,
        "exit_code": code,
        "makespan_s": round(makespan, 3),
        "ideal_s": round(case.ideal(), 3),
        "ratio": round(makespan / case.ideal(), 3),
    }


def chains(numbers: list[int] | None) -> list[list[Case]]:
    """The cases to run, each with the case it follows before it (one chain)."""
    by_number = {case.number: case for case in CASES}
    wanted = numbers or [case.number for case in CASES]
    runs: list[list[Case]] = []
    for case in CASES:
        if case.number not in wanted or any(case in chain for chain in runs):
            continue
        chain = [case]
        while chain[0].follows is not None:
            chain.insert(0, by_number[chain[0].follows])
        runs = [r for r in runs if r[0] not in chain] + [chain]
    return runs
