"""The Redis ledger: one client's send log shared by every machine that sends for it.

It keeps the invariant of every ledger (`slots.earliest_slot`, stated there): a slot
is granted only if, for every window, fewer than COUNT requests of the key are in
flight or were answered after `now - WINDOW`. Here `now` is Redis's own clock, so
hosts whose clocks disagree still share one timeline. Deciding and recording is one
Lua script (`_RESERVE`), which Redis runs atomically: one round trip per grant.

Keys, per client fingerprint (never the token) and limit key; the `{client}` hash
tag puts one client's keys on one Redis Cluster slot:

    batchrun:{client}:KEY:open     sorted set: request → lease expiry (start + hold,
                                   or the shorter one `reserve` is given)
    batchrun:{client}:KEY:done     sorted set: request → counts until (its answer,
                                   or its bounded arrival: `pacing.arrival`)
    batchrun:{client}:KEY:meta     hash: `last` start (for `spread`), `keep` seconds
    batchrun:{client}:KEY:learned  string: a learned limit (`remember`), 30 days
    batchrun:{client}:epoch        hash: `id` (random), `at` (made), `lost` (when a
                                   loss of the history was noticed), 30 days

A lease past its expiry counts as answered then (its host may have died), until a
real answer replaces it. Answers are written with the next reserve or at `close`:
until then other hosts count the request as in flight, which is never less safe.

A history Redis lost (restarted without persistence, flushed, failed over to an
empty replica, or the epoch evicted) is never read as an empty budget. Every
script run checks the epoch first, in the same atomic step: a host that saw
another epoch than the one there (or none there) marks the loss in the epoch, at
the moment the epoch was made (no send of the old history came after that).
From then on every host, including one started after the loss, reads every window
of every key as full at that moment, until the key's longest window has passed;
the host that noticed writes its leases again (its requests in flight) before it
asks for a slot. Each host keeps the epoch it last saw in its state folder, so a
run that starts after a loss it did not see notices it too.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from batchrun.core.errors import LedgerLost, StateError, UsageError
from batchrun.core.limits import Pace, Rule
from batchrun.ledgers.lost import HistoryLost, Loss
from batchrun.pacing.slots import Grant, Usage, Wait, paced, reach, spread_interval
from batchrun.store.generation import read_marker, write_marker

# Seconds to connect, and to wait for any answer. `reserve` is called from the event
# loop, which a slow Redis blocks for up to this long before the run stops.
_TIMEOUT = 2.0
_LEARNED_TTL = 30 * 24 * 3600
_SCHEMES = ("redis", "rediss")
# The epoch outlives any history it stands for; renewed by every reserve.
_EPOCH_TTL_MS = _LEARNED_TTL * 1000
# `_RESERVE`'s reply when the caller saw another epoch: write the leases, ask again.
_AGAIN = 3

# Both scripts begin alike: ARGV[1] is the caller's now; ARGV[2] the server's
# time, or '' to read Redis's own clock (`t`).
_CLOCKS = """
local now = tonumber(ARGV[1])
local t
if ARGV[2] == '' then
  local time = redis.call('TIME')
  t = tonumber(time[1]) + tonumber(time[2]) / 1000000
else
  t = tonumber(ARGV[2])
end
"""

# KEYS: the client's epoch hash; for each answer, its key's open and done sets;
# then, to reserve, the key's open set, done set and meta hash. ARGV: the caller's
# now; the server time ('' = Redis's TIME; tests pass a virtual one); the epoch the
# caller last saw ('' = none) and a fresh id should there be none; n answers as
# (member, answer time on the caller's clock, TTL ms; a TTL of 0: never sent, only
# its lease goes); then hold, keep, interval ('' = exact), member, and the rule's
# windows as a count then (COUNT, SECONDS) pairs.
# Replies {code, seconds, epoch, lost}: code 1 granted; 0 wait `seconds` ('':
# for an answer); 2 only answers written; 3 the caller saw another epoch: nothing
# granted, it writes its leases again and asks again. `epoch` is the epoch's id;
# `lost` ('' if none) when a loss of the history was noticed: every window of every
# key counts as full then. Times go out as %.17g strings: Redis truncates Lua numbers.
_RESERVE = (
    _CLOCKS
    + """
local function stamp(x) return string.format('%.17g', x) end
local epoch, seen = KEYS[1], ARGV[3]
local id = redis.call('HGET', epoch, 'id')
if not id then
  id = ARGV[4]
  redis.call('HSET', epoch, 'id', id, 'at', stamp(t))
  if seen ~= '' then redis.call('HSET', epoch, 'lost', stamp(t)) end
elseif seen ~= '' and id ~= seen and not redis.call('HGET', epoch, 'lost') then
  redis.call('HSET', epoch, 'lost', redis.call('HGET', epoch, 'at'))
end
redis.call('PEXPIRE', epoch, tonumber(ARGV[5]))
local lost = redis.call('HGET', epoch, 'lost')
local function reply(code, seconds) return {code, seconds, id, lost or ''} end
local function extend(key, ttl)
  local left = redis.call('PTTL', key)
  if left ~= -2 and left < ttl then redis.call('PEXPIRE', key, ttl) end
end
local n = tonumber(ARGV[6])
for i = 1, n do
  local at = tonumber(ARGV[3 * i + 5]) + (t - now)
  redis.call('ZREM', KEYS[2 * i], ARGV[3 * i + 4])
  if tonumber(ARGV[3 * i + 6]) > 0 then
    redis.call('ZADD', KEYS[2 * i + 1], math.min(at, t), ARGV[3 * i + 4])
    extend(KEYS[2 * i + 1], tonumber(ARGV[3 * i + 6]))
  end
end
if #KEYS == 2 * n + 1 then return reply(2, '') end
if seen ~= '' and id ~= seen then return reply(3, '') end
local open, done, meta = KEYS[2 * n + 2], KEYS[2 * n + 3], KEYS[2 * n + 4]
local a = 3 * n + 7
local hold, member = tonumber(ARGV[a]), ARGV[a + 3]
local kept = tonumber(redis.call('HGET', meta, 'keep') or 0)
local keep = math.max(tonumber(ARGV[a + 1]), kept)
local lapsed = redis.call('ZRANGEBYSCORE', open, '-inf', t, 'WITHSCORES')
for i = 1, #lapsed, 2 do redis.call('ZADD', done, lapsed[i + 1], lapsed[i]) end
redis.call('ZREMRANGEBYSCORE', open, '-inf', t)
redis.call('ZREMRANGEBYSCORE', done, '-inf', '(' .. stamp(t - keep))
local in_flight, finished = redis.call('ZCARD', open), redis.call('ZCARD', done)
local slot = -math.huge
for i = 1, tonumber(ARGV[a + 4]) do
  local needed = tonumber(ARGV[a + 3 + 2 * i]) - in_flight
  if needed <= 0 then
    local first = redis.call('ZRANGE', open, 0, 0, 'WITHSCORES')
    return reply(0, stamp(tonumber(first[2]) - t))
  end
  if finished >= needed then
    local nth = redis.call('ZREVRANGE', done, needed - 1, needed - 1, 'WITHSCORES')
    slot = math.max(slot, tonumber(nth[2]) + tonumber(ARGV[a + 4 + 2 * i]))
  end
  -- A lost history: as if each window filled up at the moment it was noticed.
  if lost then slot = math.max(slot, tonumber(lost) + tonumber(ARGV[a + 4 + 2 * i])) end
end
local last = redis.call('HGET', meta, 'last')
if ARGV[a + 2] ~= '' and last then
  slot = math.max(slot, tonumber(last) + tonumber(ARGV[a + 2]))
end
if slot > t then return reply(0, stamp(slot - t)) end
redis.call('ZADD', open, t + hold, member)
if not last or tonumber(last) < t then redis.call('HSET', meta, 'last', t) end
redis.call('HSET', meta, 'keep', keep)
local ttl = math.ceil((keep + hold) * 1000)
extend(open, ttl)
extend(done, ttl)
extend(meta, ttl)
return reply(1, '')
"""
)

# KEYS: the open set of each lease. ARGV: the caller's now, the server time (as
# `_RESERVE`), then (member, lease expiry on the caller's clock, TTL ms) per lease.
# Writes again the leases of a host's requests in flight when the history was lost.
_LEASES = (
    _CLOCKS
    + """
for i = 1, #KEYS do
  local expires = tonumber(ARGV[3 * i + 1]) + (t - now)
  if expires > t then
    redis.call('ZADD', KEYS[i], 'NX', expires, ARGV[3 * i])
    local ttl = tonumber(ARGV[3 * i + 2])
    if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
  end
end
return #KEYS
"""
)


def redacted(url: str) -> str:
    """The ledger URL as it may be shown: any password replaced by `***`."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class RedisLedger:
    """The send log of one client in Redis, shared by every host that points at it.

    Times passed in and returned are on the caller's clock (`now`); the script
    decides on Redis's clock and the offset is measured in the same round trip, so
    skewed hosts agree. `hold` is the request timeout: a lease lasts that long.
    `server_clock` replaces Redis's TIME, for tests on a virtual clock only.

    A history Redis lost (a restart without persistence, a flush, a failover to an
    empty replica, an evicted epoch) is noticed by its epoch (see the module
    docstring): `notice` is told once per loss, and `marker` (a file in the state
    folder) keeps the epoch this host last saw for its next run.

    A sync client, because the `Ledger` protocol is sync: the pacer's `reserve` runs
    on the event loop and blocks it for one round trip per grant (about 0.2 ms on
    loopback, 1 ms in a data centre, against requests paced seconds apart); a Redis
    that stops answering blocks it for at most twice `_TIMEOUT`, then the run stops.
    """

    def __init__(
        self,
        url: str,
        *,
        client: str,
        hold: float,
        now: Callable[[], float],
        server_clock: Callable[[], float] | None = None,
        notice: Callable[[HistoryLost], None] | None = None,
        marker: Path | None = None,
    ) -> None:
        self._url = url
        self._prefix = f"batchrun:{{{client}}}:"
        self._hold = hold
        self._now = now
        self._server_clock = server_clock
        self._notice = notice
        self._marker = marker
        self._name = secrets.token_hex(8)  # makes members unique across hosts
        self._last_ticket = 0
        # In flight: ticket → (key, TTL ms of its answer, its lease's expiry).
        self._tickets: dict[int, tuple[str, int, float]] = {}
        self._answers: list[tuple[str, int, float, int]] = []
        self._epoch = _kept_epoch(marker)
        self._redis = _connect(url)
        self._reserve = self._redis.register_script(_RESERVE)
        self._leases = self._redis.register_script(_LEASES)
        try:
            self._call(self._redis.ping)
        except LedgerLost as exc:
            raise StateError(exc.message) from None  # never worked: not "lost"

    def reserve(
        self, key: str, rule: Rule, pace: Pace, now: float, hold: float | None = None
    ) -> Grant | Wait:
        """Decide and record in one script run; see the module docstring. The
        lease lasts `hold`, if shorter than the request timeout."""
        ticket = self._last_ticket + 1
        lease = self._hold if hold is None else min(hold, self._hold)
        keys, args = self._answer_args(now)
        keys += [self._key(key, part) for part in ("open", "done", "meta")]
        args += [lease, reach(rule), _interval(rule, pace)]
        windows = paced(rule)
        args += [f"{self._name}:{ticket}", len(windows)]
        args += [n for w in windows for n in (w.count, w.seconds)]
        reply = self._run(keys, args, now)
        if reply[0] == _AGAIN:
            # The history was lost: this host's leases are written again, then
            # the script decides with every window full since the loss.
            return self.reserve(key, rule, pace, now, hold)
        if reply[0] != 1:
            return Wait(now + float(reply[1]) if reply[1] else None)
        self._last_ticket = ticket
        ttl = _ttl_ms(reach(rule) + self._hold)
        self._tickets[ticket] = (key, ttl, now + lease)
        return Grant(ticket)

    def release(self, ticket: int, now: float, *, sent: bool = True) -> None:
        """Keep the answer; it is written with the next reserve, or at `close`.
        One that was never sent goes as a TTL of 0: its lease is only dropped."""
        key, ttl, _ = self._tickets.pop(ticket)
        self._answers.append((key, ticket, now, ttl if sent else 0))

    def usage(self, key: str, rule: Rule) -> Usage:
        """The key's history on the caller's clock, read in one transaction."""
        self._flush()
        now = self._now()
        pipe = self._redis.pipeline(transaction=True)
        pipe.time()
        pipe.zrange(self._key(key, "open"), 0, -1, withscores=True)
        pipe.zrange(self._key(key, "done"), 0, -1, withscores=True)
        pipe.hget(self._key(key, "meta"), "last")
        pipe.hget(self._prefix + "epoch", "lost")
        clock, open_, done, last, lost = self._call(pipe.execute)
        server = (
            self._server_clock() if self._server_clock else clock[0] + clock[1] / 1e6
        )
        usage = _usage(server, now, open_, done, last, rule)
        if lost is None or server >= float(lost) + reach(rule):
            return usage
        # Lost history: every window as if it filled up at the moment of the loss.
        full = [float(lost) - server + now] * rule.deepest
        finished = sorted([*full, *usage.finished])[-rule.deepest :]
        return Usage(usage.in_flight, finished, usage.last_start)

    def recall(self, key: str) -> str | None:
        """The text last remembered for `key` by any host of this client."""
        text = self._call(self._redis.getex, self._key(key, "learned"), ex=_LEARNED_TTL)
        return None if text is None else bytes(text).decode()

    def remember(self, key: str, text: str) -> None:
        """Keep `text` for `key` (a learned limit), for 30 days after its last use."""
        self._call(self._redis.set, self._key(key, "learned"), text, ex=_LEARNED_TTL)

    def close(self) -> None:
        """Write the answers not yet written. A lost Redis only loses them, which
        is safe: the other hosts count those requests until their leases expire.
        The epoch last seen is kept for the next run, whatever happened."""
        try:
            self._flush()
        except LedgerLost:
            pass
        finally:
            self._redis.close()
            _keep_epoch(self._marker, self._epoch)

    def _flush(self) -> None:
        if self._answers:
            now = self._now()
            keys, args = self._answer_args(now)
            self._run(keys, args, now)

    def _run(self, keys: list[str], args: list[object], now: float) -> Any:
        """Run `_RESERVE`; notice an epoch other than the one last seen."""
        reply = self._call(self._reserve, keys, [_arg(a) for a in args])
        self._answers.clear()
        epoch = bytes(reply[2]).decode()
        if epoch != self._epoch:
            if self._epoch is not None:
                self._lost(now)
            self._epoch = epoch
            _keep_epoch(self._marker, epoch)
        return reply

    def _lost(self, now: float) -> None:
        """The history was lost: say so, and write this host's leases again (its
        requests in flight); every window counts as full since the loss."""
        if self._tickets:
            server = "" if self._server_clock is None else self._server_clock()
            keys: list[str] = []
            args: list[object] = [now, server]
            for ticket, (key, ttl, expires) in self._tickets.items():
                keys.append(self._key(key, "open"))
                args += [f"{self._name}:{ticket}", expires, ttl]
            self._call(self._leases, keys, [_arg(a) for a in args])
        if self._notice is not None:
            self._notice(HistoryLost(redacted(self._url), Loss.REDIS))

    def _answer_args(self, now: float) -> tuple[list[str], list[object]]:
        server = "" if self._server_clock is None else self._server_clock()
        keys = [self._prefix + "epoch"]
        seen = "" if self._epoch is None else self._epoch
        args: list[object] = [now, server, seen, secrets.token_hex(8)]
        args += [_EPOCH_TTL_MS, len(self._answers)]
        for key, ticket, at, ttl in self._answers:
            keys += [self._key(key, "open"), self._key(key, "done")]
            args += [f"{self._name}:{ticket}", at, ttl]
        return keys, args

    def _key(self, key: str, part: str) -> str:
        return f"{self._prefix}{key}:{part}"

    def _call(self, action: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return action(*args, **kwargs)
        except RedisError as exc:
            raise LedgerLost(_explain(self._url, exc)) from None


def _kept_epoch(marker: Path | None) -> str | None:
    """The epoch a host of this state folder last saw, if within the epoch's TTL
    (older, the epoch may have expired with the history it stood for)."""
    if marker is None:
        return None
    text = read_marker(marker)
    epoch, _, at = (text or "").partition(" ")
    try:
        fresh = time.time() - float(at) < _EPOCH_TTL_MS / 1000
    except ValueError:
        return None
    return epoch if fresh and epoch else None


def _keep_epoch(marker: Path | None, epoch: str | None) -> None:
    if marker is not None and epoch is not None:
        with contextlib.suppress(StateError):  # a full disk: the next run forgets
            write_marker(marker, f"{epoch} {time.time():.0f}")


def _connect(url: str) -> redis.Redis:
    scheme = urlsplit(url).scheme
    if scheme not in _SCHEMES:
        msg = f"--ledger must be a redis:// or rediss:// URL, got {redacted(url)!r}."
        raise UsageError(msg)
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=_TIMEOUT,
            socket_connect_timeout=_TIMEOUT,
            # Once, for a connection Redis closed while idle: running the script twice
            # at worst records one more lease, which only counts more.
            retry=Retry(NoBackoff(), 1),
        )
    except ValueError as exc:
        msg = f"--ledger {redacted(url)!r} is not a usable Redis URL: {exc}"
        raise UsageError(msg) from None


def _explain(url: str, exc: RedisError) -> str:
    password = urlsplit(url).password
    reason = (str(exc) or type(exc).__name__).rstrip(".")
    if password:  # as written in the URL, and as redis-py decodes it
        for secret in {password, unquote(password)}:
            reason = reason.replace(secret, "***")
    return (
        f"cannot use the ledger at {redacted(url)}: {reason}. Check --ledger (or "
        "BATCHRUN_LEDGER_URL): the address, the password, and that it is Redis 6.2+."
    )


def _usage(
    server: float,
    now: float,
    open_: Sequence[tuple[bytes, float]],
    done: Sequence[tuple[bytes, float]],
    last: bytes | None,
    rule: Rule,
) -> Usage:
    """What the script would see at `server` time, moved onto the caller's clock."""
    finished = sorted(
        [at for _, at in done] + [end for _, end in open_ if end <= server]
    )[-rule.deepest :]
    in_flight = sum(1 for _, end in open_ if end > server)
    start = None if last is None else float(last) - server + now
    return Usage(in_flight, [at - server + now for at in finished], start)


def _interval(rule: Rule, pace: Pace) -> float | str:
    return spread_interval(rule) if pace is Pace.SPREAD else ""


def _ttl_ms(seconds: float) -> int:
    return int(seconds * 1000) + 1


def _arg(value: object) -> str:
    # repr keeps every bit of a float, so the script sees exactly the caller's times.
    return repr(value) if isinstance(value, float) else str(value)
