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

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchrun.cli.news import spoken
from batchrun.core.errors import LedgerLost
from batchrun.core.limits import Pace, parse_rule
from batchrun.ledgers import sqlite_ledger as ledger_module
from batchrun.ledgers.lost import HistoryLost
from batchrun.ledgers.redis_ledger import RedisLedger
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.ledger import Ledger, MemoryLedger
from batchrun.pacing.slots import Grant, Usage, Wait, earliest_slot
from batchrun.store.database import open_database

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


@pytest.fixture(params=["memory", "sqlite", "redis"])
def timed_ledger(request, tmp_path) -> tuple[Ledger, list[float]]:
    """Each kind of ledger, with the virtual clock it reads (`clock[0]`);
    requests time out after 30 s."""
    clock = [0.0]
    if request.param == "memory":
        return MemoryLedger(), clock
    if request.param == "sqlite":
        path = tmp_path / "l.db"
        return SqliteLedger(path, client="c", hold=30.0, now=lambda: clock[0]), clock
    url = request.getfixturevalue("redis_url")
    made = RedisLedger(
        url, client="c", hold=30.0, now=lambda: clock[0], server_clock=lambda: clock[0]
    )
    return made, clock


def test_a_lease_given_at_a_grant_lapses_then_until_its_answer(
    timed_ledger: tuple[Ledger, list[float]],
) -> None:
    """Under 2/10s, a request granted at 0 with a lease of 0.5 s and one at
    0.2 with none fill the window: the next waits for the lease, not an
    answer. Lapsed, the first counts until 0.5 (the next slot 10.5), until its
    answer says it counts until 0.4 (10.4)."""
    ledger, clock = timed_ledger
    rule = parse_rule("2/10s")

    def reserve(at: float, hold: float | None = None) -> Grant | Wait:
        clock[0] = at
        return ledger.reserve("k", rule, Pace.EXACT, at, hold)

    leased = reserve(0.0, hold=0.5)
    assert isinstance(leased, Grant)
    assert isinstance(reserve(0.2), Grant)
    assert reserve(0.3) == Wait(0.5)
    lapsed = reserve(0.6)
    assert isinstance(lapsed, Wait)
    assert lapsed.until == pytest.approx(10.5)
    ledger.release(leased.ticket, 0.4)
    answered = reserve(0.7)
    assert isinstance(answered, Wait)
    assert answered.until == pytest.approx(10.4)
    ledger.close()


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


def ledger_at(path: Path, boot: str = "b") -> SqliteLedger:
    """A process of client "c" on `path`, on a machine clock of boot `boot`."""
    return SqliteLedger(path, client="c", hold=1.0, now=lambda: 0.0, boot=boot)


def sent_and_answered(ledger: SqliteLedger, rule, start: float, end: float) -> None:
    grant = ledger.reserve("k", rule, Pace.EXACT, start)
    assert isinstance(grant, Grant)
    ledger.release(grant.ticket, end)
    ledger.close()


def test_a_stamp_in_the_future_is_read_as_now(tmp_path):
    """An answer stamped later than now (a damaged row, a clock of another origin)
    counts as answered now, not as a wait of a thousand seconds."""
    rule = parse_rule("1/10s")
    sent_and_answered(ledger_at(tmp_path / "l.db"), rule, 1000.0, 1000.5)
    assert ledger_at(tmp_path / "l.db").reserve("k", rule, Pace.EXACT, 20.0) == Wait(
        30.0
    )


def test_a_request_of_an_earlier_boot_counts_from_the_start_of_this_one(tmp_path):
    """Sent and answered at 5000 s of the last boot: at 3 s of this boot it counts
    as answered at 0 s, when this boot began (it was answered before)."""
    rule = parse_rule("1/10s")
    sent_and_answered(ledger_at(tmp_path / "l.db", "one"), rule, 5000.0, 5000.2)
    here = ledger_at(tmp_path / "l.db", "two")
    assert here.reserve("k", rule, Pace.EXACT, 3.0) == Wait(10.0)
    assert isinstance(here.reserve("k", rule, Pace.EXACT, 10.0), Grant)


def test_a_request_in_flight_when_the_machine_stopped_counts_from_the_boot(tmp_path):
    """A process that died with a request in flight: after the reboot it counts as
    answered when this boot began, not at its old expiry."""
    rule = parse_rule("1/10s")
    died = ledger_at(tmp_path / "l.db", "one")
    assert isinstance(died.reserve("k", rule, Pace.EXACT, 5000.0), Grant)
    died._db.close()
    here = ledger_at(tmp_path / "l.db", "two")
    assert here.reserve("k", rule, Pace.EXACT, 3.0) == Wait(10.0)


def test_rows_of_an_earlier_boot_are_pruned_once_this_boot_outlived_them(
    tmp_path, monkeypatch
):
    """An earlier boot's rows go when their keep has passed since this boot began,
    however large their old stamps."""
    monkeypatch.setattr(ledger_module, "_KEEP", 10.0)
    monkeypatch.setattr(ledger_module, "_PRUNE_EVERY", 2)
    rule = parse_rule("100/1s")
    sent_and_answered(ledger_at(tmp_path / "l.db", "one"), rule, 5000.0, 5000.2)
    here = ledger_at(tmp_path / "l.db", "two")
    for second in (5.0, 6.0, 20.0):
        here.reserve("k", rule, Pace.EXACT, second)
    with sqlite3.connect(tmp_path / "l.db") as db:
        (old,) = db.execute("SELECT count(*) FROM send_log WHERE boot = 'one'")
    assert old == (0,)


def _truncated(path: Path) -> None:
    path.write_bytes(b"")


def _deleted(path: Path) -> None:
    path.unlink()


def _replaced(path: Path) -> None:
    other = path.with_name("other.db")
    ledger_at(other).close()
    other.replace(path)


@pytest.mark.parametrize("loss", [_truncated, _deleted, _replaced])
def test_a_ledger_that_lost_its_history_paces_its_first_window_as_full(tmp_path, loss):
    """Emptied, deleted or replaced: the marker beside it tells, and every key
    (even one never sent) waits out each window as if it were full."""
    path, rule = tmp_path / "l.db", parse_rule("2/10s+5/30s")
    sent_and_answered(ledger_at(path), rule, 0.0, 0.1)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    loss(path)
    here = SqliteLedger(path, client="c", hold=1.0, now=lambda: 100.0, boot="b")
    assert here.lost_history
    assert here.reserve("k", rule, Pace.EXACT, 100.0) == Wait(130.0)
    assert here.reserve("new", rule, Pace.EXACT, 120.0) == Wait(130.0)
    # Another process that opens it later reads the same horizon.
    later = SqliteLedger(path, client="c", hold=1.0, now=lambda: 110.0, boot="b")
    assert not later.lost_history
    assert later.reserve("k", rule, Pace.EXACT, 110.0) == Wait(130.0)
    assert isinstance(here.reserve("k", rule, Pace.EXACT, 130.0), Grant)


def test_a_lost_marker_alone_costs_nothing(tmp_path):
    """The ledger intact and its marker gone: nothing was lost, nothing waits."""
    path, rule = tmp_path / "l.db", parse_rule("1/10s")
    ledger_at(path).close()
    (tmp_path / "l.generation").unlink()
    here = ledger_at(path)
    assert not here.lost_history
    assert isinstance(here.reserve("k", rule, Pace.EXACT, 0.0), Grant)
    assert (tmp_path / "l.generation").exists()


def test_a_horizon_of_an_earlier_boot_counts_from_the_start_of_this_one(tmp_path):
    """A loss noticed in the last boot holds this boot's first window at most."""
    path, rule = tmp_path / "l.db", parse_rule("1/10s")
    ledger_at(path).close()
    _deleted(path)
    SqliteLedger(path, client="c", hold=1.0, now=lambda: 900.0, boot="one").close()
    here = ledger_at(path, "two")
    assert not here.lost_history
    assert here.reserve("k", rule, Pace.EXACT, 3.0) == Wait(10.0)


def test_wall_clock_rows_of_an_older_batchrun_are_read_as_a_lost_history(tmp_path):
    """Rows stamped on the wall clock by an older batchrun cannot be placed on the
    machine clock: they go, and the first window is paced as full instead."""
    path, rule = tmp_path / "l.db", parse_rule("1/10s")
    old = open_database(path, ledger_module._MIGRATIONS[:2])
    old.execute(
        "INSERT INTO send_log (client, key, at, keep_until) "
        "VALUES ('c', 'k', 1.7e9, 1.7e9 + 3600)"
    )
    old.close()
    here = SqliteLedger(path, client="c", hold=1.0, now=lambda: 50.0, boot="b")
    assert here.lost_history
    assert here.reserve("k", rule, Pace.EXACT, 50.0) == Wait(60.0)


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

    def slow_catch_up(self, *args):
        real(self, *args)
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


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_request_never_sent_gives_its_slot_back(tmp_path, kind):
    """Released with sent=False (no connection was made), a grant takes no room
    in any window: the next reserve is granted at once, in every process."""
    rule = parse_rule("1/1m")

    def make():
        if kind == "memory":
            return MemoryLedger()
        return SqliteLedger(tmp_path / "l.db", client="c", hold=HOLD, now=lambda: 0.0)

    one = make()
    grant = one.reserve("a", rule, Pace.EXACT, 0.0)
    assert isinstance(grant, Grant)
    one.release(grant.ticket, 0.1, sent=False)
    again = one.reserve("a", rule, Pace.EXACT, 0.2)
    assert isinstance(again, Grant)
    one.release(again.ticket, 0.3)
    assert isinstance(one.reserve("a", rule, Pace.EXACT, 0.4), Wait)
    if kind == "sqlite":
        one.close()
        other = make()
        assert isinstance(other.reserve("a", rule, Pace.EXACT, 0.5), Wait)
        assert len(other.usage("a", rule).finished) == 1


def test_a_ledger_emptied_in_place_mid_run_is_read_as_full_by_every_process(
    tmp_path,
):
    """Issue 40: rows deleted under running processes. The first to look again
    sets the horizon in the file (said once), so a process that opens it after
    reads every window as full too, instead of an empty budget."""
    path, rule, said = tmp_path / "l.db", parse_rule("1/10s"), list[HistoryLost]()
    one = SqliteLedger(path, client="c", hold=1.0, now=lambda: 0.0, notice=said.append)
    grant = one.reserve("k", rule, Pace.EXACT, 0.0)
    assert isinstance(grant, Grant)
    one.release(grant.ticket, 0.1)
    assert one.reserve("k", rule, Pace.EXACT, 1.0) == Wait(10.1)
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM send_log")
    assert one.reserve("k", rule, Pace.EXACT, 6.0) == Wait(16.0)
    assert one.reserve("k", rule, Pace.EXACT, 7.0) == Wait(16.0)
    later = SqliteLedger(path, client="c", hold=1.0, now=lambda: 8.0)
    assert later.reserve("k", rule, Pace.EXACT, 8.0) == Wait(16.0)
    assert len(said) == 1
    assert "emptied while in use" in spoken(said[0])


@pytest.mark.parametrize("loss", [_deleted, _replaced])
def test_a_ledger_deleted_or_replaced_mid_run_stops_the_run(tmp_path, loss):
    """Issue 40: the file at the path is no longer the one this process writes:
    its next reserve raises LedgerLost (the run stops, exit 75); the next run
    never reads an empty budget."""
    path, rule = tmp_path / "l.db", parse_rule("1/10s")
    running = SqliteLedger(path, client="c", hold=1.0, now=lambda: 0.0, boot="b")
    assert isinstance(running.reserve("k", rule, Pace.EXACT, 0.0), Grant)
    loss(path)
    with pytest.raises(LedgerLost, match="deleted or replaced while in use"):
        running.reserve("k", rule, Pace.EXACT, 2.0)
    running.close()
    after = SqliteLedger(path, client="c", hold=1.0, now=lambda: 3.0, boot="b")
    wait = after.reserve("k", rule, Pace.EXACT, 3.0)
    # Never an empty budget: the horizon (13 s) or, replaced under a -wal that
    # was left, the old history itself (the lease, counted until 1 s).
    assert isinstance(wait, Wait)
    assert wait.until is not None
    assert wait.until >= 11.0
