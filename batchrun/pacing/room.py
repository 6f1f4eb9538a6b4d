"""Whether a key's server counts the requests it refuses, and what that frees.

The slot rule counts every request sent, a refused one too, because a server
may count what it refuses (a sliding log kept in a Redis sorted set that adds
each arrival before it counts them). Most do not (nginx's `limit_req`, a token
bucket, the moving window of `limits`). Against those a refusal holds one of
the rule's slots for a window for nothing, and when a run's jobs fill its last
window exactly, the job it displaced waits a whole window more.

The model: a key's server either counts its refusals or does not; until it is
seen which, they count. The client knows its own recent refusals, so a
request the rule allows only with them left out ("past the refusals") tells:

- accepted, the server did not count them: from then on the key's refusals
  take no room (each window's count is raised by the key's refusals in it);
- refused, it did: they count, and that refusal is no news of the rule's
  count (the pacer says so, and the learner does not read it).

While unknown, one such request is in flight at a time (the test), only while
the key is steady (`Room.steady`) and has nothing else in flight, and only
where the rule counting the refusals forbids it by more than twice the
longest a request of the key was seen to count after its grant (`Room.lag`):
the server, counting from arrivals, then still holds them all when the test
arrives. Once they are seen not to count, any refusal makes it unknown again
(another consumer, a server that changed): they count until the next test.
What is known is kept in the ledger, so a server that counts refusals pays
its test once per process that does not know it yet.

What it rests on: an acceptance past the refusals is read as the server not
counting them, though a rule looser than the one paced would explain it too;
then they are taken not to count on weak grounds, and the next refusal takes
it back. Buckets and even spacing are left as they are (refusals count).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

from batchrun.core.limits import Pace, Rule, Window
from batchrun.pacing.learning.storage import KEPT_FOR
from batchrun.pacing.ledger import Ledger
from batchrun.pacing.slots import Grant, Wait, earliest_slot

# The ledger key, after the limit key's, of whether the server counts refusals.
ROOM_SUFFIX = "#refusals"
# A refusal is left out of a window only while it counts in it by more than
# this (seconds). Memory and SQLite hold the very moment; Redis rebases it to
# the caller's clock, off by up to its round trip's asymmetry, which matters
# only if the server counts refusals after all (then the next refusal says so).
_EDGE = 0.001


@dataclass(slots=True)
class Room:
    """One key's refusals and what is known of whether its server counts them."""

    # None: not known yet (they count); True: they count; False: they do not.
    counted: bool | None = None
    # When each of this process's recent refusals stops counting, ascending.
    refusals: list[float] = field(default_factory=list)
    # Tests granted past the refusals while unknown, not yet answered.
    past: set[int] = field(default_factory=set)
    # When each request in flight was granted, while refusals may not count.
    sent: dict[int, float] = field(default_factory=dict)
    # The longest a request was seen to count after it was granted (it only
    # grows: one slow exchange makes tests rarer for the rest of the process).
    lag: float = 0.0
    # Paced by a rule that is not itself on test (a reading with a safer one
    # behind it, a lesson under re-test) and that no refusal has put in
    # question since it came in force: only then does a refusal past the
    # refusals say they count, not that the rule was wrong.
    steady: bool = True

    def lifted(self, rule: Rule, pace: Pace, now: float) -> Rule | None:
        """`rule` with the key's refusals left out (each window's count raised by
        those still counting in it), or None when none are to be: they count,
        none is recent, or the key is paced by a bucket or evenly."""
        if self.counted or not self.refusals or not lifts(rule, pace):
            return None
        horizon = now - max(w.seconds for w in rule.windows) + _EDGE
        self.refusals = [end for end in self.refusals if end > horizon]
        if not self.refusals:
            return None
        windows = []
        for window in rule.windows:
            since = now - window.seconds + _EDGE
            inside = sum(1 for end in self.refusals if end > since)
            # At most twice as deep: the ledgers keep that much (`ledger`).
            windows.append(
                Window(window.count + min(inside, window.count), window.seconds)
            )
        return Rule(tuple(windows))

    def reserve(
        self, ledger: Ledger, key: str, rule: Rule, pace: Pace, now: float
    ) -> Grant | Wait:
        """A slot of `key` now from `ledger`, by `rule`, or past the refusals:
        freely once the server is seen not to count them; while unknown, as the
        one test in flight, if the key is steady, has nothing else in flight,
        and the rule counting them forbids the request by more than twice the
        lag (so the server, counting from arrivals, holds them all when the
        test arrives)."""
        lifted = self.lifted(rule, pace, now)
        if lifted is None:
            grant = ledger.reserve(key, rule, pace, now)
            return grant if self.counted else self._granted(grant, now)
        test = False  # known not to count: past them freely (a refusal undoes it)
        if self.counted is None:
            usage = ledger.usage(key, lifted)
            plain = earliest_slot(usage, rule, pace)
            # Nothing in flight (it may not have reached the server yet), and
            # the rule's own slot far enough off that every answered one counts.
            far = plain is not None and plain > now + 2 * self.lag
            test = usage.in_flight == 0 and far and self.steady
            if not test:
                # By the rule itself, in one step with the ledger's other
                # senders: only a test goes past the refusals.
                return self._granted(ledger.reserve(key, rule, pace, now), now)
            if self.past:
                return Wait(None)  # the test's answer decides
        grant = self._granted(ledger.reserve(key, lifted, pace, now), now)
        if isinstance(grant, Grant) and test:
            self.past.add(grant.ticket)
        return grant

    def _granted(self, grant: Grant | Wait, now: float) -> Grant | Wait:
        if isinstance(grant, Grant):
            self.sent[grant.ticket] = now
        return grant

    def answered(self, ticket: int, refused: bool | None, ends: float) -> bool:
        """Record the answer of `ticket` (`refused`: a 429, False: accepted, None:
        neither, or no answer) counting until `ends`. True: the room test was
        refused, which the server counting refusals explains: the learner is
        not to read it (it is no news of the rule's count)."""
        before = self.counted
        tested = ticket in self.past and refused is not None
        self.past.discard(ticket)
        sent = self.sent.pop(ticket, None)
        if sent is not None and refused is not None:
            self.lag = max(self.lag, ends - sent)
        if tested and before is None:
            self.counted = refused
        elif refused and before is False:
            # Seen not to count them, and now refused: another consumer, a
            # server that changed, or they count after all. Tested again.
            self.counted = None
        if refused:
            self.steady = False
        if refused and not self.counted:
            bisect.insort(self.refusals, ends)
        if self.counted is not before:
            # Requests sent past the refusals before settle nothing now.
            self.past.clear()
        return tested and before is None and refused is True


def lifts(rule: Rule, pace: Pace) -> bool:
    """Whether refusals the server does not count are ever left out of `rule`
    paced so: only windows paced exactly; a bucket or even spacing keeps them."""
    return rule.burst is None and pace is Pace.EXACT


def kept(counted: bool | None, at: float) -> str:
    """Whether the server counts refusals, as the text a ledger keeps (None:
    not known, kept as nothing); `at`: wall-clock seconds, when it was seen."""
    if counted is None:
        return "{}"
    return json.dumps({"counted": counted, "at": at})


def recalled(text: str | None, *, now: float, kept_for: float) -> bool | None:
    """What a ledger kept (`kept`), if readable and seen within `kept_for`
    seconds before `now`; None otherwise (not known: refusals count)."""
    found = _read(text, now=now, kept_for=kept_for)
    return None if found is None else found[0]


def _read(
    text: str | None, *, now: float, kept_for: float
) -> tuple[bool, float] | None:
    try:
        found = json.loads(text or "{}")
        counted, at = found["counted"], float(found["at"])
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return None
    if not isinstance(counted, bool) or not now - kept_for <= at <= now + 86400.0:
        return None
    return counted, at


def known(ledger: Ledger, key: str, *, now: float) -> bool | None:
    """What `ledger` keeps of whether `key`'s server counts refusals (`kept`),
    if seen within `KEPT_FOR` before `now` (wall clock); None: not known."""
    found = seen(ledger, key, now=now)
    return None if found is None else found[0]


def remember(ledger: Ledger, key: str, counted: bool | None, *, at: float) -> None:
    """Keep in `ledger` whether `key`'s server counts refusals (`kept`)."""
    ledger.remember(f"{key}{ROOM_SUFFIX}", kept(counted, at))


def seen(ledger: Ledger, key: str, *, now: float) -> tuple[bool, float] | None:
    """As `known`, with when it was seen (wall clock); None: not known."""
    text = ledger.recall(f"{key}{ROOM_SUFFIX}")
    return _read(text, now=now, kept_for=KEPT_FOR)


def forget(ledger: Ledger, key: str, *, now: float) -> bool:
    """Forget whether `key`'s server counts refusals; True if it was known
    (`seen` at `now`), as `limits` shows it."""
    was = seen(ledger, key, now=now)
    if ledger.recall(f"{key}{ROOM_SUFFIX}") not in (None, "{}"):
        remember(ledger, key, None, at=now)
    return was is not None
