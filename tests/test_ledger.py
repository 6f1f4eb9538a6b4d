"""The shared SQLite ledger: its in-memory copy always agrees with the table.

Each process reads only the rows changed since it last looked. The reference here
reads the whole table the plain way (every row of the key, with a dead process's
request answered at its expiry) and must reach the same verdict at every step,
whatever the interleaving of processes, answers, deaths and restarts.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from batchrun.ledger import SqliteLedger
from batchrun.limits import parse_rule
from batchrun.pacer import Grant, Pace, Usage, Wait, earliest_slot

RULES = {"a": parse_rule("2/1s+3/3s"), "b": parse_rule("1/0.5s")}
HOLD = 1.0

step = st.tuples(
    st.sampled_from(["reserve"] * 3 + ["release"] * 2 + ["restart"]),
    st.integers(0, 1),  # which process
    st.sampled_from(sorted(RULES)),
    st.sampled_from([0.0, 0.0, 0.25, 0.5, 1.0, 1.5, 2.5]),  # exact in binary
    st.sampled_from(list(Pace)),
)


def expected(path: Path, key: str, pace: Pace, now: float) -> Grant | Wait | None:
    """The verdict from the whole table; None stands for "a grant"."""
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT start, end, expires FROM requests WHERE client = 'c' AND key = ?",
            (key,),
        ).fetchall()
    open_ = [expires for _, end, expires in rows if end is None and expires > now]
    finished = sorted(
        end if end is not None else expires
        for _, end, expires in rows
        if end is not None or expires <= now
    )
    last = max((start for start, _, _ in rows), default=None)
    slot = earliest_slot(Usage(len(open_), finished, last), RULES[key], pace)
    if slot is None:
        return Wait(min(open_, default=None))
    return Wait(slot) if slot > now else None


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=60))
def test_every_process_sees_what_the_table_says(steps):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ledger.db"

        def process() -> SqliteLedger:
            return SqliteLedger(path, client="c", hold=HOLD, now=lambda: now)

        now = 1000.0
        ledgers = [process() for _ in range(2)]
        tickets: list[list[int]] = [[], []]
        try:
            for action, who, key, later, pace in steps:
                now += later
                if action == "reserve":
                    want = expected(path, key, pace, now)
                    got = ledgers[who].reserve(key, RULES[key], pace, now)
                    if want is None:
                        assert isinstance(got, Grant)
                        tickets[who].append(got.ticket)
                    else:
                        assert got == want
                elif action == "release" and tickets[who]:
                    ledgers[who].release(tickets[who].pop(0), now)
                elif action == "restart":
                    # A killed process never answers; its successor starts afresh.
                    tickets[who] = []
                    ledgers[who].close()
                    ledgers[who] = process()
        finally:
            for ledger in ledgers:
                ledger.close()


def test_an_answer_after_the_expiry_replaces_the_expiry(tmp_path):
    """A request counted as answered at its expiry is counted once, at its answer,
    when the answer comes after all."""
    rule = parse_rule("3/10s")

    def process() -> SqliteLedger:
        return SqliteLedger(tmp_path / "l.db", client="c", hold=1.0, now=lambda: 0.0)

    slow, other = process(), process()
    late = slow.reserve("k", rule, Pace.EXACT, 0.0)
    assert isinstance(late, Grant)
    # At 2 s, `other` counts the request as answered at its expiry (1 s).
    assert isinstance(other.reserve("k", rule, Pace.EXACT, 2.0), Grant)
    slow.release(late.ticket, 3.0)
    # One answered (at 3 s) and one in flight: a third request may go.
    assert isinstance(other.reserve("k", rule, Pace.EXACT, 4.0), Grant)
    assert other.reserve("k", rule, Pace.EXACT, 4.0) == Wait(13.0)
