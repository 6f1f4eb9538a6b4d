"""The run's news in words: each value a run tells (`run.news.News`) as a sentence.

What a person reads in the log, or above the live view.

Below the command line a run only tells values (a run resuming, a stop and its
reason, a ledger's lost history); the words are all here.
"""

from __future__ import annotations

import time
from typing import assert_never

from batchrun.api.breaker import Tripped
from batchrun.core.events import Because, Evidence, Status
from batchrun.ledgers.lost import HistoryLost, Loss
from batchrun.pacing.kept import Kept
from batchrun.run.exit_code import Cause, Why
from batchrun.run.halt import Halted
from batchrun.run.news import News, NothingToSend, Resuming, Stopping
from batchrun.store.crosscheck import Recovered
from batchrun.store.runs import InvitesAgain, Moved, StartedOver

# What a stop the run asked for says, before it waits for the requests in flight.
_STOPPING = {
    Cause.SIGINT: "Ctrl-C (again to stop at once)",
    Cause.SIGTERM: "SIGTERM (Ctrl-C to stop at once)",
    Cause.DEADLINE: "Deadline reached",
}


def spoken(news: News) -> str:
    """`news` as the sentence a person reads."""
    match news:
        case Resuming(total=total):
            return (
                f"Resuming: {total[Status.DONE]} done earlier, "
                f"{total[Status.PENDING]} to send, {total[Status.FAILED]} failed "
                f"(--retry-failed retries them), {total[Status.UNKNOWN]} unknown "
                "(--retry-unknown)."
            )
        case NothingToSend():
            return _nothing_to_send(news)
        case Stopping():
            return _stopping(news)
        case Moved(recorded=recorded, jobs_file=jobs_file):
            return f"Resuming the run of {recorded}, which moved to {jobs_file}."
        case StartedOver():
            return _started_over(news)
        case InvitesAgain(invites=invites):
            return (
                f"{invites} invite(s) done or unknown in the earlier run will be "
                "sent again: each invitee gets the email again."
            )
        case Recovered():
            return _recovered(news)
        case HistoryLost():
            return _history_lost(news)
        case _:
            assert_never(news)


def why_text(why: Why) -> str:
    """Why a cause stopped a run, in words."""
    match why:
        case Halted():
            return halted_text(why)
        case Tripped():
            return tripped_text(why)
        case str():
            return why
        case _:
            assert_never(why)


def halted_text(halted: Halted) -> str:
    """Why --halt-after halted the run: its failed jobs, and the policy."""
    failed, ended, policy = halted.failed, halted.ended, halted.policy
    if policy.percent is None:
        return f"{failed} job(s) failed in this run (--halt-after {policy})"
    share = 100 * failed / ended
    return (
        f"{failed} of {ended} ended jobs failed in this run ({share:.0f}%, "
        f"--halt-after {policy})"
    )


def tripped_text(tripped: Tripped) -> str:
    """Why the breaker stopped the run: the cause and its fix."""
    count, error = tripped.count, tripped.error
    if tripped.cause == "token":
        return (
            f"the last {count} requests were refused ({error}): the token "
            "(BATCHRUN_TOKEN or --token) is missing, wrong, expired or lacks the "
            "rights."
        )
    if tripped.cause == "network":
        return (
            f"the last {count} requests never reached the server ({error}): "
            "check --base-url and the network."
        )
    return f"the last {count} requests failed alike: {error}"


def _nothing_to_send(news: NothingToSend) -> str:
    total = news.total
    named = f" (round {news.round})" if news.round else ""
    return (
        f"Nothing to send: every job of {news.jobs_file} ended in an earlier run"
        f"{named}: {total[Status.DONE]} done, {total[Status.FAILED]} failed "
        f"(--retry-failed), {total[Status.UNKNOWN]} unknown (--retry-unknown). "
        "To send every job again as a new round, give a new --run-id (--run-id %F: "
        "one round a day); --restart forgets the run."
    )


def _stopping(news: Stopping) -> str:
    if news.at_once:
        return "Second Ctrl-C: stopping now; in-flight jobs are settled on resume."
    why = why_text(news.why)
    if news.cause is Cause.BREAKER:
        return f"Circuit breaker: {why}"
    if news.cause is Cause.LEDGER_LOST:
        return f"Ledger lost: {why}\nStarted no new requests; those in flight ended."
    head = f"Halted: {why}" if news.cause is Cause.HALT else _STOPPING[news.cause]
    return f"{head}: starting no new requests, waiting for those in flight."


def _started_over(news: StartedOver) -> str:
    why = "--restart" if news.run_id is None else f"New round {news.run_id}"
    before = f" (round {news.before})" if news.before else ""
    return (
        f"{why}: every job is sent again, {news.done} done in the earlier "
        f"run{before} included; {news.never_sent} of it were never sent."
    )


def _recovered(news: Recovered) -> str:
    what = "invites" if news.invites else "not safe to send twice"
    named = f", {news.unsafe} of them {what}," if news.unsafe else ""
    kind = ", ".join(
        f"{news.ended[s]} {s.value}"
        for s in (Status.DONE, Status.UNKNOWN, Status.FAILED)
        if news.ended.get(s)
    )
    total = sum(news.ended.values())
    return (
        f"The results file {news.results} records {total} job(s){named} as ended "
        f"that the run store still had to send ({kind}): the store lost its latest "
        "writes (its -wal file deleted while in use? a state folder restored from "
        "a backup?). They are not sent again; --retry-unknown and --retry-failed "
        "resend those asked for."
    )


def _history_lost(news: HistoryLost) -> str:
    if news.loss is Loss.REDIS:
        return (
            f"The send ledger at {news.ledger} lost its history (Redis restarted "
            "without persistence, was flushed or failed over, or evicted a key): "
            "every window of every key is paced as if full until the key's longest "
            "window has passed since the loss."
        )
    if news.loss is Loss.SINCE_LAST_USED:
        return (
            f"The send ledger {news.ledger} was emptied, deleted or replaced since "
            "it was last used: each window is paced as if it were full."
        )
    return (
        f"The send ledger {news.ledger} was emptied while in use: every window of "
        "every key is paced as if full until the key's longest window has passed."
    )


def evidence_text(evidence: Evidence) -> str:
    """Why a key is paced by a learned rule, in words."""
    match evidence.because:
        case Because.REFUSED:
            return f"{evidence.refused} requests refused"
        case Because.AGAIN:
            return f"{evidence.refused} requests refused again"
        case Because.STATED:
            return f"the server states {_grammar(evidence)} in its rate-limit headers"
        case Because.SAFER:
            return f"the safer statement {evidence.rule}"
        case _:
            assert_never(evidence.because)


def kept_text(kept: Kept) -> str:
    """When a kept lesson was learned, and why."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(kept.began))
    return f"learned {when}: {evidence_text(kept.why)}"


def _grammar(evidence: Evidence) -> str:
    return "" if evidence.rule is None else evidence.rule.grammar
