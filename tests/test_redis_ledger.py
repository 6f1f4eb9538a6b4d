"""The Redis ledger, against a real redis-server of the tests' own.

The property test runs several hosts with skewed clocks on one Redis, on a virtual
server clock, and checks every verdict against a brute-force reading of what Redis
holds (plus the answers the reserving host has yet to write), as tests/test_ledger.py
does for the SQLite log. The other tests use Redis's own TIME.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchrun.cli.news import spoken
from batchrun.core.errors import StateError, UsageError
from batchrun.core.limits import Pace, Rule, Window, parse_rule
from batchrun.ledgers.lost import HistoryLost
from batchrun.ledgers.redis_ledger import RedisLedger, redacted
from batchrun.pacing.slots import Grant, Usage, Wait, earliest_slot
from tests.conftest import REDIS_PASSWORD, RedisServer, free_port, redis_process

# "c": a leaky bucket's reading, which the script keeps as extra windows.
RULES = {
    "a": parse_rule("2/1s+3/3s"),
    "b": parse_rule("1/0.5s"),
    "c": Rule((Window(4, 2.0),), 1),
}
HOLD = 1.0
SKEWS = (0.0, 7.25, -3.5)  # each host's clock minus the server's
PREFIX = "batchrun:{c}:"

step = st.tuples(
    st.sampled_from(["reserve"] * 4 + ["release"] * 3 + ["die", "restart"]),
    st.integers(0, len(SKEWS) - 1),  # which host
    st.sampled_from(sorted(RULES)),
    st.sampled_from([0.0, 0.0, 0.25, 0.5, 1.0, 1.5, 2.5]),  # exact in binary
    st.sampled_from(list(Pace)),
)


def scores(db, name: str) -> dict[bytes, float]:
    return dict(db.zrange(PREFIX + name, 0, -1, withscores=True))


def expected(db, key, pace, server, now, unwritten) -> Wait | None:
    """The verdict from what Redis holds plus the reserving host's unwritten answers
    (member → key, answer time on its clock), on its clock; None stands for "a
    grant"."""
    open_ = scores(db, f"{key}:open")
    ends = scores(db, f"{key}:done")
    for member, (of, at) in unwritten.items():
        if of != key:
            continue
        open_.pop(member, None)
        ends[member] = min(at + (server - now), server)
    finished = sorted([*ends.values(), *(e for e in open_.values() if e <= server)])
    live = [e for e in open_.values() if e > server]
    last = db.hget(PREFIX + f"{key}:meta", "last")
    usage = Usage(len(live), finished, None if last is None else float(last))
    slot = earliest_slot(usage, RULES[key], pace)
    if slot is None:
        return Wait(now + (min(live) - server))
    return Wait(now + (slot - server)) if slot > server else None


class Host:
    """One host of the property test: its ledger, on its own skewed clock, and
    what it holds that Redis does not yet know (tickets, unwritten answers)."""

    def __init__(self, url: str, skew: float, server: list[float]) -> None:
        self.url, self.skew, self.server = url, skew, server
        self.ledger = self._start()

    def _start(self) -> RedisLedger:
        self.tickets: dict[int, str] = {}  # in flight: ticket → key, oldest first
        self.unwritten: dict[bytes, tuple[str, float]] = {}
        return RedisLedger(
            self.url,
            client="c",
            hold=HOLD,
            now=lambda: self.server[0] + self.skew,
            server_clock=lambda: self.server[0],
        )

    def reserve(self, db, key: str, pace: Pace) -> None:
        now = self.server[0] + self.skew
        want = expected(db, key, pace, self.server[0], now, self.unwritten)
        got = self.ledger.reserve(key, RULES[key], pace, now)
        self.unwritten = {}
        if want is None:
            assert isinstance(got, Grant)
            self.tickets[got.ticket] = key
        else:
            assert got == want

    def release(self) -> None:
        if self.tickets:
            ticket = next(iter(self.tickets))
            now = self.server[0] + self.skew
            self.ledger.release(ticket, now)
            member = f"{self.ledger._name}:{ticket}".encode()
            self.unwritten[member] = (self.tickets.pop(ticket), now)

    def die(self) -> None:
        """Killed: its unwritten answers are lost, its leases expire."""
        self.ledger._redis.close()
        self.ledger = self._start()

    def restart(self) -> None:
        """Stopped cleanly: close() writes its answers."""
        self.ledger.close()
        self.ledger = self._start()


@settings(max_examples=200, deadline=None)
@given(st.lists(step, max_size=60))
def test_every_host_sees_what_redis_holds(redis_server: RedisServer, steps):
    """Every verdict of every host, whatever the interleaving of answers, deaths and
    restarts, is the one a brute-force reading of Redis gives."""
    db = redis_server.connect()
    db.flushall()
    server = [1000.0]
    hosts = [Host(redis_server.url, skew, server) for skew in SKEWS]
    try:
        for action, who, key, later, pace in steps:
            server[0] += later
            if action == "reserve":
                hosts[who].reserve(db, key, pace)
            else:
                getattr(hosts[who], action)()
    finally:
        for host in hosts:
            host.ledger.close()


def virtual_host(
    url: str, clock: list[float], skew: float = 0.0, hold: float = 1.0
) -> RedisLedger:
    """A host on a virtual server clock (`clock[0]`), its own clock `skew` ahead."""
    return RedisLedger(
        url,
        client="c",
        hold=hold,
        now=lambda: clock[0] + skew,
        server_clock=lambda: clock[0],
    )


def test_an_answer_after_the_expiry_replaces_the_expiry(redis_url):
    """A lease counted as answered at its expiry is counted once, at its answer,
    when the answer comes after all."""
    rule, clock = parse_rule("3/10s"), [0.0]
    slow, other = virtual_host(redis_url, clock), virtual_host(redis_url, clock, 5.0)
    late = slow.reserve("k", rule, Pace.EXACT, 0.0)
    assert isinstance(late, Grant)
    clock[0] = 2.0  # `other` counts the lease as answered at its expiry (1 s)
    assert isinstance(other.reserve("k", rule, Pace.EXACT, 7.0), Grant)
    clock[0] = 3.0
    slow.release(late.ticket, 3.0)
    slow.close()  # writes the answer
    clock[0] = 4.0
    assert isinstance(other.reserve("k", rule, Pace.EXACT, 9.0), Grant)
    assert other.reserve("k", rule, Pace.EXACT, 9.0) == Wait(18.0)


def test_old_answers_are_pruned_by_the_longest_window_any_host_uses(
    redis_url, redis_server
):
    """Answers no window can need go; a host with a shorter rule does not prune
    what another host's longer window still needs."""
    clock = [0.0]
    ledger = virtual_host(redis_url, clock)
    wide, short = parse_rule("1000/10s"), parse_rule("1000/1s")
    for second in range(30):
        clock[0] = float(second)
        grant = ledger.reserve("k", wide, Pace.EXACT, clock[0])
        assert isinstance(grant, Grant)
        ledger.release(grant.ticket, clock[0] + 0.5)
    ledger.reserve("k", short, Pace.EXACT, clock[0])
    db = redis_server.connect()
    done = db.zrange(PREFIX + "k:done", 0, -1, withscores=True)
    assert min(at for _, at in done) >= clock[0] - 10.0
    assert 9 <= len(done) <= 11


def test_two_ledgers_on_one_redis_never_share_a_slot(redis_url):
    """Two hosts reserving at once from two threads get COUNT grants in all."""
    rule = parse_rule("25/1h")
    grants: list[Grant] = []

    def hammer() -> None:
        ledger = RedisLedger(redis_url, client="c", hold=60.0, now=time.time)
        for _ in range(40):
            got = ledger.reserve("k", rule, Pace.EXACT, time.time())
            if isinstance(got, Grant):
                grants.append(got)
        ledger.close()

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert len(grants) == 25


def test_hosts_with_skewed_clocks_agree_on_redis_time(redis_url):
    """A host an hour ahead and one an hour behind share one window, and each gets
    its wait on its own clock."""

    def at(skew: float) -> RedisLedger:
        return RedisLedger(
            redis_url, client="c", hold=60.0, now=lambda: time.time() + skew
        )

    ahead, behind, rule = at(3600.0), at(-3600.0), parse_rule("1/10s")
    grant = ahead.reserve("k", rule, Pace.EXACT, time.time() + 3600.0)
    assert isinstance(grant, Grant)
    ahead.release(grant.ticket, time.time() + 3600.0)
    ahead.close()
    asked = time.time() - 3600.0
    wait = behind.reserve("k", rule, Pace.EXACT, asked)
    assert isinstance(wait, Wait)
    assert wait.until is not None
    assert 9.5 < wait.until - asked <= 10.0


def test_usage_shows_other_hosts_on_the_callers_clock(redis_url):
    """`usage` counts another host's requests, in flight and answered, moved onto
    the caller's clock."""
    clock, rule = [100.0], parse_rule("5/1m")
    sender = virtual_host(redis_url, clock, hold=30.0)
    reader = virtual_host(redis_url, clock, skew=50.0)
    first = sender.reserve("k", rule, Pace.EXACT, 100.0)
    assert isinstance(first, Grant)
    assert isinstance(sender.reserve("k", rule, Pace.EXACT, 100.0), Grant)
    clock[0] = 101.0
    sender.release(first.ticket, 100.5)
    sender.close()
    assert reader.usage("k", rule) == Usage(1, [150.5], 150.0)


def test_every_key_expires_after_the_longest_window_and_the_hold(
    redis_url, redis_server
):
    """An idle client leaves nothing behind: each key's TTL is its longest window
    plus the hold; a learned limit and the epoch are kept for 30 days."""
    ledger = RedisLedger(redis_url, client="c", hold=30.0, now=time.time)
    rule = parse_rule("5/1m+10/2m")
    grants = [ledger.reserve("k", rule, Pace.EXACT, time.time()) for _ in range(2)]
    assert isinstance(grants[0], Grant)
    assert isinstance(grants[1], Grant)
    ledger.release(grants[0].ticket, time.time())
    ledger.remember("k", "{}")
    ledger.close()
    db = redis_server.connect()
    ttls = {k.decode(): db.pttl(k) for k in db.keys("*")}
    learned = ttls.pop(PREFIX + "k:learned")
    epoch = ttls.pop(PREFIX + "epoch")
    assert sorted(ttls) == [PREFIX + f"k:{p}" for p in ("done", "meta", "open")]
    assert all(140_000 < ttl <= 150_001 for ttl in ttls.values())
    assert learned > 29 * 24 * 3600 * 1000
    assert epoch > 29 * 24 * 3600 * 1000


def test_a_script_flushed_from_redis_is_loaded_again(redis_url):
    """A Redis that restarted (or SCRIPT FLUSH) answers NOSCRIPT once; the ledger
    loads the script again and goes on."""
    ledger = RedisLedger(redis_url, client="c", hold=1.0, now=time.time)
    rule = parse_rule("5/1s")
    assert isinstance(ledger.reserve("k", rule, Pace.EXACT, time.time()), Grant)
    ledger._redis.script_flush()
    assert isinstance(ledger.reserve("k", rule, Pace.EXACT, time.time()), Grant)


def test_learned_limits_are_shared_by_every_host(redis_url):
    """What one host remembers for a key, another recalls; other keys have none."""
    one = RedisLedger(redis_url, client="c", hold=1.0, now=time.time)
    two = RedisLedger(redis_url, client="c", hold=1.0, now=time.time)
    one.remember("run-query", '{"rule": "10/1m"}')
    assert two.recall("run-query") == '{"rule": "10/1m"}'
    assert two.recall("invite") is None


def test_clients_do_not_share_a_budget(redis_url):
    """Two clients (fingerprints) on one Redis have a window each."""
    rule = parse_rule("1/1h")
    for client in ("c1", "c2"):
        ledger = RedisLedger(redis_url, client=client, hold=1.0, now=time.time)
        assert isinstance(ledger.reserve("k", rule, Pace.EXACT, time.time()), Grant)


def test_the_url_is_shown_without_its_password():
    """Only the password is hidden; URLs without one are shown as given."""
    assert redacted("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redacted("rediss://ann:pw@h/1") == "rediss://ann:***@h/1"
    assert redacted("redis://h:6379") == "redis://h:6379"


def assert_state_error(url: str, *hints: str) -> None:
    with pytest.raises(StateError) as caught:
        RedisLedger(url, client="c", hold=1.0, now=time.time)
    assert caught.value.exit_code == 74
    message = caught.value.message
    assert REDIS_PASSWORD not in message
    assert "wrong-pw" not in message
    for hint in hints:
        assert hint in message


def test_a_wrong_password_is_an_exit_74_error(redis_server: RedisServer):
    """A wrong password names the ledger, hides the password, and exits 74."""
    url = f"redis://:wrong-pw@127.0.0.1:{redis_server.port}/0"
    where = f"redis://:***@127.0.0.1:{redis_server.port}/0"
    assert_state_error(url, where, "password")


def test_no_password_to_a_redis_that_wants_one_is_an_exit_74_error(redis_server):
    """A Redis that requires a password and gets none: exit 74, saying so."""
    assert_state_error(f"redis://127.0.0.1:{redis_server.port}/0", "Authentication")


def test_nothing_listening_is_an_exit_74_error():
    """Nothing on the port: exit 74, naming the ledger without its password."""
    port = free_port()
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{port}/0"
    assert_state_error(url, f"redis://:***@127.0.0.1:{port}/0", "--ledger")


def test_a_server_that_is_not_redis_is_an_exit_74_error():
    """A server that answers like HTTP, not Redis: exit 74."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def answer_like_http() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(1024)
                connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer_like_http, daemon=True)
        thread.start()
        assert_state_error(f"redis://:wrong-pw@127.0.0.1:{port}/0", "ledger")
        thread.join(timeout=5)


def test_redis_lost_mid_run_is_a_state_error(tmp_path):
    """A Redis that goes away after the start: the next reserve raises StateError
    (the runner stops on it); close() still returns."""
    with redis_process(tmp_path) as server:
        ledger = RedisLedger(server.url, client="c", hold=1.0, now=time.time)
        rule = parse_rule("5/1s")
        grant = ledger.reserve("k", rule, Pace.EXACT, time.time())
        assert isinstance(grant, Grant)
        ledger.release(grant.ticket, time.time())
    with pytest.raises(StateError, match=r"cannot use the ledger at redis://:\*\*\*@"):
        ledger.reserve("k", rule, Pace.EXACT, time.time())
    ledger.close()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param("http://:pw@h/0", "http://:***@h/0", id="scheme"),
        pytest.param(
            "redis://:pw@127.0.0.1:99999999/0",
            "redis://:***@127.0.0.1:99999999/0",
            id="port",
        ),
    ],
)
def test_a_url_that_is_not_a_redis_url_is_a_usage_error(url, shown):
    """--ledger that is no Redis URL is bad usage (exit 2), shown without secrets."""
    with pytest.raises(UsageError) as caught:
        RedisLedger(url, client="c", hold=1.0, now=time.time)
    assert shown in caught.value.message
    assert "pw@" not in caught.value.message


def test_rediss_speaks_tls_and_verifies_the_certificate(tmp_path):
    """rediss:// works with the server's CA given (`?ssl_ca_certs=`), and a
    certificate the client cannot verify is an exit-74 error."""
    with redis_process(tmp_path, tls=True) as server:
        ledger = RedisLedger(server.url, client="c", hold=1.0, now=time.time)
        grant = ledger.reserve("k", parse_rule("1/1s"), Pace.EXACT, time.time())
        assert isinstance(grant, Grant)
        ledger.close()
        untrusted = server.url.partition("?")[0]
        assert_state_error(untrusted, "rediss://:***@127.0.0.1", "certificate")


def test_a_request_never_sent_gives_its_slot_back(redis_url):
    """Released with sent=False, a grant's lease is dropped and nothing is kept:
    every host may take the slot again."""
    rule = parse_rule("1/1m")
    one = RedisLedger(redis_url, client="c", hold=30.0, now=time.time)
    other = RedisLedger(redis_url, client="c", hold=30.0, now=time.time)
    grant = one.reserve("a", rule, Pace.EXACT, time.time())
    assert isinstance(grant, Grant)
    assert isinstance(other.reserve("a", rule, Pace.EXACT, time.time()), Wait)
    one.release(grant.ticket, time.time(), sent=False)
    one.close()
    again = other.reserve("a", rule, Pace.EXACT, time.time())
    assert isinstance(again, Grant)
    other.close()


def flushed(redis_server: RedisServer) -> None:
    """Redis loses every key, as after a restart without persistence."""
    redis_server.connect().flushdb()


def test_a_flushed_redis_reads_as_full_until_the_longest_window_passed(
    redis_url, redis_server
):
    """Issue 40: a history lost under a host is read as every window full at the
    moment the loss was noticed, until the rule's longest window has passed, and
    never as an empty budget; the loss is said once."""
    clock, rule, said = [0.0], parse_rule("2/1s+5/10s"), list[HistoryLost]()
    host = RedisLedger(
        redis_url,
        client="c",
        hold=1.0,
        now=lambda: clock[0],
        server_clock=lambda: clock[0],
        notice=said.append,
    )
    grant = host.reserve("k", rule, Pace.EXACT, 0.0)
    assert isinstance(grant, Grant)
    host.release(grant.ticket, 0.25)
    clock[0] = 1.0
    flushed(redis_server)
    clock[0] = 2.0
    assert host.reserve("k", rule, Pace.EXACT, 2.0) == Wait(12.0)
    assert host.reserve("other", parse_rule("1/3s"), Pace.EXACT, 2.0) == Wait(5.0)
    assert host.usage("k", rule).finished == [2.0, 2.0, 2.0, 2.0, 2.0]
    clock[0] = 12.0
    assert isinstance(host.reserve("k", rule, Pace.EXACT, 12.0), Grant)
    assert len(said) == 1
    assert "lost its history" in spoken(said[0])
    assert REDIS_PASSWORD not in spoken(said[0])
    assert "redis://:***@127.0.0.1" in spoken(said[0])


def test_a_host_that_never_saw_the_loss_is_told_by_one_that_did(
    redis_url, redis_server
):
    """A host that starts after the loss finds an epoch it cannot doubt; once a
    host that knew the old one notices, both read every window as full since
    the new epoch was made (no send of the lost history came after)."""
    clock, rule = [0.0], parse_rule("3/10s")
    knew = virtual_host(redis_url, clock)
    assert isinstance(knew.reserve("k", rule, Pace.EXACT, 0.0), Grant)
    flushed(redis_server)
    clock[0] = 1.5
    new = virtual_host(redis_url, clock)
    assert isinstance(new.reserve("k", rule, Pace.EXACT, 1.5), Grant)
    clock[0] = 2.0
    assert knew.reserve("k", rule, Pace.EXACT, 2.0) == Wait(11.5)
    assert new.reserve("k", rule, Pace.EXACT, 2.0) == Wait(11.5)


def test_the_host_that_notices_writes_its_leases_again(redis_url, redis_server):
    """Requests in flight when the history was lost count again as in flight, for
    every host, until their answer or their lease's end."""
    clock, rule = [0.0], parse_rule("1/1s")
    one = virtual_host(redis_url, clock, hold=30.0)
    other = virtual_host(redis_url, clock, skew=5.0)
    assert isinstance(one.reserve("k", rule, Pace.EXACT, 0.0), Grant)
    flushed(redis_server)
    clock[0] = 0.5
    assert one.reserve("other", rule, Pace.EXACT, 0.5) == Wait(1.5)
    clock[0] = 2.0
    # In flight (one's lease, to 30 s), not a window of the lost history (1.5 s).
    assert other.reserve("k", rule, Pace.EXACT, 7.0) == Wait(35.0)


def test_a_later_run_notices_a_loss_by_the_epoch_it_kept(
    tmp_path, redis_url, redis_server
):
    """A host keeps the epoch it saw in its state folder: its next run notices a
    loss in between, which a host without the marker cannot."""
    clock, rule, said = [0.0], parse_rule("4/1m"), list[HistoryLost]()

    def run(marker) -> RedisLedger:
        return RedisLedger(
            redis_url,
            client="c",
            hold=1.0,
            now=lambda: clock[0],
            server_clock=lambda: clock[0],
            notice=said.append,
            marker=marker,
        )

    first = run(tmp_path / "redis.generation")
    assert isinstance(first.reserve("k", rule, Pace.EXACT, 0.0), Grant)
    first.close()
    flushed(redis_server)
    clock[0] = 10.0
    assert isinstance(run(None).reserve("j", rule, Pace.EXACT, 10.0), Grant)
    clock[0] = 20.0
    again = run(tmp_path / "redis.generation")
    assert again.reserve("k", rule, Pace.EXACT, 20.0) == Wait(70.0)
    assert len(said) == 1
