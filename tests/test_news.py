"""The run's news in words (cli/news.py): every kind of news a run tells, as the
sentence it printed when the modules below the command line wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchrun.api.breaker import Tripped
from batchrun.cli import terminal
from batchrun.cli.news import evidence_text, spoken, why_text
from batchrun.core.events import Because, Evidence, Status
from batchrun.core.limits import parse_rule
from batchrun.ledgers.lost import HistoryLost, Loss
from batchrun.run.exit_code import Cause
from batchrun.run.halt import Halted, HaltPolicy
from batchrun.run.news import News, NothingToSend, Resuming, Stopping
from batchrun.store.crosscheck import Recovered
from batchrun.store.runs import InvitesAgain, Moved, StartedOver

TOTAL = {
    Status.PENDING: 30,
    Status.IN_FLIGHT: 0,
    Status.DONE: 10,
    Status.FAILED: 2,
    Status.UNKNOWN: 1,
}
WAITING = ": starting no new requests, waiting for those in flight."


@pytest.mark.parametrize(
    ("news", "text"),
    [
        (
            Resuming(TOTAL),
            "Resuming: 10 done earlier, 30 to send, 2 failed (--retry-failed "
            "retries them), 1 unknown (--retry-unknown).",
        ),
        (
            NothingToSend(Path("jobs.csv"), None, TOTAL),
            "Nothing to send: every job of jobs.csv ended in an earlier run: 10 "
            "done, 2 failed (--retry-failed), 1 unknown (--retry-unknown). To send "
            "every job again as a new round, give a new --run-id (--run-id %F: one "
            "round a day); --restart forgets the run.",
        ),
        (
            NothingToSend(Path("jobs.csv"), "n1", TOTAL),
            "Nothing to send: every job of jobs.csv ended in an earlier run (round "
            "n1): 10 done, 2 failed (--retry-failed), 1 unknown (--retry-unknown). "
            "To send every job again as a new round, give a new --run-id (--run-id "
            "%F: one round a day); --restart forgets the run.",
        ),
        (Stopping(Cause.SIGINT), f"Ctrl-C (again to stop at once){WAITING}"),
        (Stopping(Cause.SIGTERM), f"SIGTERM (Ctrl-C to stop at once){WAITING}"),
        (Stopping(Cause.DEADLINE), f"Deadline reached{WAITING}"),
        (
            Stopping(Cause.HALT, Halted(HaltPolicy(count=3), 3, 7)),
            f"Halted: 3 job(s) failed in this run (--halt-after 3){WAITING}",
        ),
        (
            Stopping(Cause.SIGINT, at_once=True),
            "Second Ctrl-C: stopping now; in-flight jobs are settled on resume.",
        ),
        (
            Stopping(Cause.BREAKER, Tripped("network", 5, "connection refused")),
            "Circuit breaker: the last 5 requests never reached the server "
            "(connection refused): check --base-url and the network.",
        ),
        (
            Stopping(Cause.LEDGER_LOST, "cannot use the ledger"),
            "Ledger lost: cannot use the ledger\nStarted no new requests; those in "
            "flight ended.",
        ),
        (
            Moved("/old/jobs.csv", Path("new/jobs.csv")),
            "Resuming the run of /old/jobs.csv, which moved to new/jobs.csv.",
        ),
        (
            StartedOver(None, None, 14, 0),
            "--restart: every job is sent again, 14 done in the earlier run "
            "included; 0 of it were never sent.",
        ),
        (
            StartedOver("n2", "n1", 14, 3),
            "New round n2: every job is sent again, 14 done in the earlier run "
            "(round n1) included; 3 of it were never sent.",
        ),
        (
            InvitesAgain(2),
            "2 invite(s) done or unknown in the earlier run will be sent again: "
            "each invitee gets the email again.",
        ),
        (
            Recovered(Path("r.jsonl"), {Status.DONE: 3, Status.UNKNOWN: 2}, 3, True),
            "The results file r.jsonl records 5 job(s), 3 of them invites, as ended "
            "that the run store still had to send (3 done, 2 unknown): the store "
            "lost its latest writes (its -wal file deleted while in use? a state "
            "folder restored from a backup?). They are not sent again; "
            "--retry-unknown and --retry-failed resend those asked for.",
        ),
        (
            Recovered(Path("r.jsonl"), {Status.FAILED: 1, Status.DONE: 1}, 2, False),
            "The results file r.jsonl records 2 job(s), 2 of them not safe to send "
            "twice, as ended that the run store still had to send (1 done, 1 "
            "failed): the store lost its latest writes (its -wal file deleted while "
            "in use? a state folder restored from a backup?). They are not sent "
            "again; --retry-unknown and --retry-failed resend those asked for.",
        ),
        (
            HistoryLost("state/ledger.db", Loss.EMPTIED),
            "The send ledger state/ledger.db was emptied while in use: every window "
            "of every key is paced as if full until the key's longest window has "
            "passed.",
        ),
        (
            HistoryLost("state/ledger.db", Loss.SINCE_LAST_USED),
            "The send ledger state/ledger.db was emptied, deleted or replaced since "
            "it was last used: each window is paced as if it were full.",
        ),
        (
            HistoryLost("redis://:***@host:6379/0", Loss.REDIS),
            "The send ledger at redis://:***@host:6379/0 lost its history (Redis "
            "restarted without persistence, was flushed or failed over, or evicted "
            "a key): every window of every key is paced as if full until the key's "
            "longest window has passed since the loss.",
        ),
    ],
)
def test_each_kind_of_news_is_said_as_before(news: News, text: str):
    assert spoken(news) == text


@pytest.mark.parametrize(
    ("why", "text"),
    [
        (
            Tripped("token", 5, "HTTP 401 Unauthorized"),
            "the last 5 requests were refused (HTTP 401 Unauthorized): the token "
            "(BATCHRUN_TOKEN or --token) is missing, wrong, expired or lacks the "
            "rights.",
        ),
        (
            Tripped("tls", 5, "not trusted"),
            "the last 5 requests failed alike: not trusted",
        ),
        (
            Halted(HaltPolicy(percent=50.0), 20, 20),
            "20 of 20 ended jobs failed in this run (100%, --halt-after 50%)",
        ),
        ("a state error's message", "a state error's message"),
    ],
)
def test_why_a_run_stopped_in_words(why, text):
    assert why_text(why) == text


def test_a_warning_is_set_apart(capsys):
    """Invites sent again on a --restart: a warning on stderr, as `warning`
    writes it; other news goes to the log it is given."""
    said: list[str] = []
    tell = terminal.telling(said.append)
    tell(InvitesAgain(1))
    tell(Stopping(Cause.DEADLINE))
    assert capsys.readouterr().err == (
        "warning: 1 invite(s) done or unknown in the earlier run will be sent "
        "again: each invitee gets the email again.\n"
    )
    assert said == [f"Deadline reached{WAITING}"]


@pytest.mark.parametrize(
    ("evidence", "text"),
    [
        (Evidence(Because.REFUSED, 2), "2 requests refused"),
        (Evidence(Because.AGAIN, 7), "7 requests refused again"),
        (
            Evidence(Because.STATED, rule=parse_rule("10/2s+500/1h")),
            "the server states 10/2s+500/1h in its rate-limit headers",
        ),
        (
            Evidence(Because.SAFER, rule=parse_rule("15/1m+500/1h")),
            "the safer statement 15/1m+500/1h",
        ),
    ],
)
def test_why_a_rule_was_learned_is_said_as_before(evidence: Evidence, text: str):
    """The learner keeps its evidence as a value; the words are the cli's."""
    assert evidence_text(evidence) == text
