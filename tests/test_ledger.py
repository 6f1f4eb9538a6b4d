"""The shared SQLite ledger: its in-memory copy always agrees with the log.

Each process reads only the rows written since it last looked, and writes its
answers with its next reserve. The reference here reads the whole log the plain way
(a dead process's request answered at its expiry) and must reach the same verdict
at every step, whatever the interleaving of processes, answers, deaths and restarts.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from batchrun import sqlite_ledger as ledger_module
from batchrun.ledger import MemoryLedger
from batchrun.limits import parse_rule
from batchrun.slots import Grant, Pace, Usage, Wait, earliest_slot
from batchrun.sqlite_ledger import SqliteLedger

RULES = {"a": parse_rule("2/1s+3/3s"), "b": parse_rule("1/0.5s")}
HOLD = 1.0

step = st.tuples(
    st.sampled_from(["reserve"] * 4 + ["release"] * 3 + ["die", "restart"]),
    st.integers(0, 1),  # which process
    st.sampled_from(sorted(RULES)),
    st.sampled_from([0.0, 0.0, 0.25, 0.5, 1.0, 1.5, 2.5]),  # exact in binary
    st.sampled_from(list(Pace)),
)


def expected(
    path: Path, key: str, pace: Pace, now: float, unwritten: dict[int, float]
) -> Wait | None:
    """The verdict from the whole log plus the answers the reserving process has
    yet to write; None stands for "a grant"."""
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT seq, ticket, at, expires FROM send_log "
            "WHERE client = 'c' AND key = ?",
            (key,),
        ).fetchall()
    sends = {seq: (at, expires) for seq, ticket, at, expires in rows if ticket is None}
    ends = {ticket: at for _, ticket, at, _ in rows if ticket is not None}
    ends |= {t: end for t, end in unwritten.items() if t in sends}
    open_ = [e for t, (_, e) in sends.items() if t not in ends and e > now]
    finished = sorted(
        ends.get(t, expires)
        for t, (_, expires) in sends.items()
        if t in ends or expires <= now
    )
    last = max((start for start, _ in sends.values()), default=None)
    slot = earliest_slot(Usage(len(open_), finished, last), RULES[key], pace)
    if slot is None:
        return Wait(min(open_, default=None))
    return Wait(slot) if slot > now else None


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=60))
def test_every_process_sees_what_the_log_says(steps):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ledger.db"

        def process() -> SqliteLedger:
            return SqliteLedger(path, client="c", hold=HOLD, now=lambda: now)

        now = 1000.0
        ledgers = [process() for _ in range(2)]
        tickets: list[list[int]] = [[], []]
        # Answers a process has taken but not yet written to the log.
        unwritten: list[dict[int, float]] = [{}, {}]
        try:
            for action, who, key, later, pace in steps:
                now += later
                if action == "reserve":
                    want = expected(path, key, pace, now, unwritten[who])
                    got = ledgers[who].reserve(key, RULES[key], pace, now)
                    unwritten[who] = {}
                    if want is None:
                        assert isinstance(got, Grant)
                        tickets[who].append(got.ticket)
                    else:
                        assert got == want
                elif action == "release" and tickets[who]:
                    ticket = tickets[who].pop(0)
                    ledgers[who].release(ticket, now)
                    unwritten[who][ticket] = now
                elif action == "die":
                    # Killed: its unwritten answers are lost, its requests expire.
                    ledgers[who]._db.close()
                    tickets[who], unwritten[who] = [], {}
                    ledgers[who] = process()
                elif action == "restart":
                    # Stopped cleanly: close() writes its answers.
                    ledgers[who].close()
                    tickets[who], unwritten[who] = [], {}
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
    slow.close()  # writes the answer
    # One answered (at 3 s) and one in flight: a third request may go.
    assert isinstance(other.reserve("k", rule, Pace.EXACT, 4.0), Grant)
    assert other.reserve("k", rule, Pace.EXACT, 4.0) == Wait(13.0)


def test_old_rows_are_pruned_but_sequence_numbers_never_reused(tmp_path, monkeypatch):
    """Rows no window needs go; the newest stays, so a process that looked long ago
    still sees every row written after."""
    monkeypatch.setattr(ledger_module, "_KEEP", 10.0)
    monkeypatch.setattr(ledger_module, "_PRUNE_EVERY", 5)
    path = tmp_path / "l.db"
    busy = SqliteLedger(path, client="c", hold=1.0, now=lambda: 0.0)
    idle = SqliteLedger(path, client="c", hold=1.0, now=lambda: 0.0)
    wide = parse_rule("1000/1s")
    for second in range(100):
        grant = busy.reserve("k", wide, Pace.EXACT, float(second))
        assert isinstance(grant, Grant)
        busy.release(grant.ticket, second + 0.5)
    with sqlite3.connect(path) as db:
        (rows,) = db.execute("SELECT count(*) FROM send_log").fetchone()
    assert 20 <= rows <= 40  # about the last 12 s of sends and answers
    assert isinstance(idle.reserve("k", wide, Pace.EXACT, 100.0), Grant)
    # Long after, everything is old: all rows go but the newest.
    strict = parse_rule("1/1s")
    while busy._reserves % 5 != 0:
        busy.reserve("other", wide, Pace.EXACT, 5000.0)
    assert isinstance(busy.reserve("k", strict, Pace.EXACT, 10_000.0), Grant)
    # The idle process last looked at 100 s; it still sees that request.
    assert idle.reserve("k", strict, Pace.EXACT, 10_000.0) == Wait(10_001.0)


def test_sqlite_keeps_learned_limits_for_every_process_of_the_client(tmp_path):
    """What one process remembers, another recalls; other clients see none."""
    path = tmp_path / "l.db"
    one = SqliteLedger(path, client="c", hold=1.0, now=lambda: 0.0)
    one.remember("run-query", '{"rule": "10/1m"}')
    one.remember("run-query", '{"rule": "9/1m"}')
    one.close()
    two = SqliteLedger(path, client="c", hold=1.0, now=lambda: 0.0)
    other = SqliteLedger(path, client="d", hold=1.0, now=lambda: 0.0)
    assert two.recall("run-query") == '{"rule": "9/1m"}'
    assert two.recall("invite") is None
    assert other.recall("run-query") is None


def test_memory_keeps_learned_limits_for_its_process():
    """The memory ledger recalls what it was told, per key."""
    ledger = MemoryLedger()
    ledger.remember("invite", "{}")
    assert ledger.recall("invite") == "{}"
    assert ledger.recall("avatar") is None


def test_windows_longer_than_an_hour_are_not_pruned_early(tmp_path):
    """A send is kept as long as the rule's longest window, past the 1 h default:
    a 2/2h rule still counts two sends of 70 minutes ago in a new process."""
    path = tmp_path / "l.db"
    rule = parse_rule("2/2h")
    first = SqliteLedger(path, client="c", hold=1.0, now=lambda: 0.0)
    for at in (0.0, 1.0):
        grant = first.reserve("k", rule, Pace.EXACT, at)
        assert isinstance(grant, Grant)
        first.release(grant.ticket, at + 0.5)
    first.close()
    later = SqliteLedger(path, client="c", hold=1.0, now=lambda: 4200.0)
    # Its first reserve prunes before it reads: the two sends must survive it.
    assert later.reserve("k", rule, Pace.EXACT, 4200.0) == Wait(7200.5)


def _reserve_racing(path: str, start, grants) -> None:
    """One process: wait for the start, then try to take a slot of 1/1h."""
    import time

    real = SqliteLedger._catch_up

    def slow_catch_up(self):
        real(self)
        time.sleep(0.2)  # between reading the log and writing the send

    SqliteLedger._catch_up = slow_catch_up  # type: ignore[method-assign]
    ledger = SqliteLedger(Path(path), client="c", hold=30.0, now=lambda: 0.0)
    start.wait()
    verdict = ledger.reserve("k", parse_rule("1/1h"), Pace.EXACT, 0.0)
    grants.put(isinstance(verdict, Grant))
    ledger.close()


def test_reserve_is_atomic_across_processes(tmp_path):
    """Four processes race for the last slot, each slowed between reading the log
    and writing its send: exactly one gets it (BEGIN IMMEDIATE serializes them)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    start, grants = context.Event(), context.Queue()
    path = str(tmp_path / "l.db")
    SqliteLedger(Path(path), client="c", hold=30.0, now=lambda: 0.0).close()
    racers = [
        context.Process(target=_reserve_racing, args=(path, start, grants))
        for _ in range(4)
    ]
    for racer in racers:
        racer.start()
    start.set()
    verdicts = [grants.get(timeout=20) for _ in racers]
    for racer in racers:
        racer.join(timeout=20)
    assert sorted(verdicts) == [False, False, False, True]
