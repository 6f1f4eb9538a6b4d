"""The Redis ledger: one client's send log shared by every machine that sends for it.

It keeps the invariant of every ledger (`slots.earliest_slot`, stated there): a slot
is granted only if, for every window, fewer than COUNT requests of the key are in
flight or were answered after `now - WINDOW`. Here `now` is Redis's own clock, so
hosts whose clocks disagree still share one timeline. Deciding and recording is one
Lua script (`_RESERVE`), which Redis runs atomically: one round trip per grant.

Keys, per client fingerprint (never the token) and limit key; the `{client}` hash
tag puts one client's keys on one Redis Cluster slot:

    batchrun:{client}:KEY:open     sorted set: request → lease expiry (start + hold)
    batchrun:{client}:KEY:done     sorted set: request → counts until (its answer,
                                   or its bounded arrival: `pacing.arrival`)
    batchrun:{client}:KEY:meta     hash: `last` start (for `spread`), `keep` seconds
    batchrun:{client}:KEY:learned  string: a learned limit (`remember`), 30 days

A lease past its expiry counts as answered then (its host may have died), until a
real answer replaces it. Answers are written with the next reserve or at `close`:
until then other hosts count the request as in flight, which is never less safe.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from batchrun.core.errors import LedgerLost, StateError, UsageError
from batchrun.core.limits import Pace, Rule
from batchrun.pacing.slots import Grant, Usage, Wait, paced, reach, spread_interval

# Seconds to connect, and to wait for any answer. `reserve` is called from the event
# loop, which a slow Redis blocks for up to this long before the run stops.
_TIMEOUT = 2.0
_LEARNED_TTL = 30 * 24 * 3600
_SCHEMES = ("redis", "rediss")

# KEYS: for each answer, its key's open and done sets; then, to reserve, the key's
# open set, done set and meta hash. ARGV: the caller's now; the server time ('' =
# Redis's TIME; tests pass a virtual one); n answers as (member, answer time on the
# caller's clock, TTL ms; a TTL of 0: never sent, only its lease goes); then hold,
# keep, interval ('' = exact), member, and the rule's windows as a count then
# (COUNT, SECONDS) pairs.
# Replies: {1} granted; {0, seconds} wait that long; {0} wait for an answer; {2} only
# answers written. Times go out as %.17g strings: Redis truncates Lua numbers.
_RESERVE = """
local now = tonumber(ARGV[1])
local t
if ARGV[2] == '' then
  local time = redis.call('TIME')
  t = tonumber(time[1]) + tonumber(time[2]) / 1000000
else
  t = tonumber(ARGV[2])
end
local function extend(key, ttl)
  local left = redis.call('PTTL', key)
  if left ~= -2 and left < ttl then redis.call('PEXPIRE', key, ttl) end
end
local n = tonumber(ARGV[3])
for i = 1, n do
  local at = tonumber(ARGV[3 * i + 2]) + (t - now)
  redis.call('ZREM', KEYS[2 * i - 1], ARGV[3 * i + 1])
  if tonumber(ARGV[3 * i + 3]) > 0 then
    redis.call('ZADD', KEYS[2 * i], math.min(at, t), ARGV[3 * i + 1])
    extend(KEYS[2 * i], tonumber(ARGV[3 * i + 3]))
  end
end
if #KEYS == 2 * n then return {2} end
local open, done, meta = KEYS[2 * n + 1], KEYS[2 * n + 2], KEYS[2 * n + 3]
local a = 3 * n + 4
local hold, member = tonumber(ARGV[a]), ARGV[a + 3]
local kept = tonumber(redis.call('HGET', meta, 'keep') or 0)
local keep = math.max(tonumber(ARGV[a + 1]), kept)
local lapsed = redis.call('ZRANGEBYSCORE', open, '-inf', t, 'WITHSCORES')
for i = 1, #lapsed, 2 do redis.call('ZADD', done, lapsed[i + 1], lapsed[i]) end
redis.call('ZREMRANGEBYSCORE', open, '-inf', t)
redis.call('ZREMRANGEBYSCORE', done, '-inf', '(' .. string.format('%.17g', t - keep))
local in_flight, finished = redis.call('ZCARD', open), redis.call('ZCARD', done)
local slot = -math.huge
for i = 1, tonumber(ARGV[a + 4]) do
  local needed = tonumber(ARGV[a + 3 + 2 * i]) - in_flight
  if needed <= 0 then
    local first = redis.call('ZRANGE', open, 0, 0, 'WITHSCORES')
    return {0, string.format('%.17g', tonumber(first[2]) - t)}
  end
  if finished >= needed then
    local nth = redis.call('ZREVRANGE', done, needed - 1, needed - 1, 'WITHSCORES')
    slot = math.max(slot, tonumber(nth[2]) + tonumber(ARGV[a + 4 + 2 * i]))
  end
end
local last = redis.call('HGET', meta, 'last')
if ARGV[a + 2] ~= '' and last then
  slot = math.max(slot, tonumber(last) + tonumber(ARGV[a + 2]))
end
if slot > t then return {0, string.format('%.17g', slot - t)} end
redis.call('ZADD', open, t + hold, member)
if not last or tonumber(last) < t then redis.call('HSET', meta, 'last', t) end
redis.call('HSET', meta, 'keep', keep)
local ttl = math.ceil((keep + hold) * 1000)
extend(open, ttl)
extend(done, ttl)
extend(meta, ttl)
return {1}
"""


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
    ) -> None:
        self._url = url
        self._prefix = f"batchrun:{{{client}}}:"
        self._hold = hold
        self._now = now
        self._server_clock = server_clock
        self._name = secrets.token_hex(8)  # makes members unique across hosts
        self._last_ticket = 0
        self._tickets: dict[int, tuple[str, int]] = {}
        self._answers: list[tuple[str, int, float, int]] = []
        self._redis = _connect(url)
        self._reserve = self._redis.register_script(_RESERVE)
        try:
            self._call(self._redis.ping)
        except LedgerLost as exc:
            raise StateError(exc.message) from None  # never worked: not "lost"

    def reserve(self, key: str, rule: Rule, pace: Pace, now: float) -> Grant | Wait:
        """Decide and record in one script run; see the module docstring."""
        ticket = self._last_ticket + 1
        keys, args = self._answer_args(now)
        keys += [self._key(key, part) for part in ("open", "done", "meta")]
        args += [self._hold, reach(rule), _interval(rule, pace)]
        windows = paced(rule)
        args += [f"{self._name}:{ticket}", len(windows)]
        args += [n for w in windows for n in (w.count, w.seconds)]
        reply = self._call(self._reserve, keys, [_arg(a) for a in args])
        self._answers.clear()
        if reply[0] != 1:
            return Wait(now + float(reply[1]) if len(reply) > 1 else None)
        self._last_ticket = ticket
        self._tickets[ticket] = (key, _ttl_ms(reach(rule) + self._hold))
        return Grant(ticket)

    def release(self, ticket: int, now: float, *, sent: bool = True) -> None:
        """Keep the answer; it is written with the next reserve, or at `close`.
        One that was never sent goes as a TTL of 0: its lease is only dropped."""
        key, ttl = self._tickets.pop(ticket)
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
        clock, open_, done, last = self._call(pipe.execute)
        server = (
            self._server_clock() if self._server_clock else clock[0] + clock[1] / 1e6
        )
        return _usage(server, now, open_, done, last, rule)

    def recall(self, key: str) -> str | None:
        """The text last remembered for `key` by any host of this client."""
        text = self._call(self._redis.getex, self._key(key, "learned"), ex=_LEARNED_TTL)
        return None if text is None else bytes(text).decode()

    def remember(self, key: str, text: str) -> None:
        """Keep `text` for `key` (a learned limit), for 30 days after its last use."""
        self._call(self._redis.set, self._key(key, "learned"), text, ex=_LEARNED_TTL)

    def close(self) -> None:
        """Write the answers not yet written. A lost Redis only loses them, which
        is safe: the other hosts count those requests until their leases expire."""
        try:
            self._flush()
        except LedgerLost:
            pass
        finally:
            self._redis.close()

    def _flush(self) -> None:
        if self._answers:
            now = self._now()
            keys, args = self._answer_args(now)
            self._call(self._reserve, keys, [_arg(a) for a in args])
            self._answers.clear()

    def _answer_args(self, now: float) -> tuple[list[str], list[object]]:
        server = "" if self._server_clock is None else self._server_clock()
        keys: list[str] = []
        args: list[object] = [now, server, len(self._answers)]
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
