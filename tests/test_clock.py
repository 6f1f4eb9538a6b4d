"""Stepping the wall clock changes no window: pacing reads the machine clock only.

The machine's two clocks are faked: the boot clock follows the loop's virtual time
(as CLOCK_BOOTTIME follows real time), and the wall clock is that plus an offset the
test steps an hour forward or back, as an administrator, NTP or a virtual machine's
resync would. The server (the in-process sandbox) counts arrivals on the loop's
clock, so it is the independent judge of the rule.
"""

from __future__ import annotations

import contextlib
import time

import anyio
import pytest
import trio.testing

from batchrun.api.client import asgi_transport
from batchrun.core.clock import MachineClock, boot_id
from batchrun.core.events import Status
from batchrun.core.identity import Identity
from batchrun.core.limits import LimitKey, limit_table, parse_override, parse_rule
from batchrun.jobs.endpoints import JobType
from batchrun.jobs.job import Job
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.ledger import Ledger, MemoryLedger
from batchrun.run.settings import Settings
from batchrun.run.wiring import Target, open_run
from batchrun.sandbox.app import Sandbox, create_app
from support.doubles import ListRecorder, ListSink
from support.oracles import max_in_window
from tests.fakes import Latency

RULE = "10/1s"
EPOCH = 1.7e9


@pytest.fixture
def anyio_backend():
    """Virtual time: an hour's stall would show as an hour, at no cost."""
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


class SteppedClocks:
    """The machine's clocks under test: boot time follows the loop; the wall
    clock is the loop's time plus `step`, which the test changes."""

    def __init__(self) -> None:
        self.step = 0.0

    def wall(self) -> float:
        return EPOCH + anyio.current_time() + self.step

    def boot(self, clock_id: int) -> float:
        return 500.0 + anyio.current_time()

    async def step_at(self, moments: dict[float, float]) -> None:
        """At each loop moment, move the wall clock by its step (seconds)."""
        for moment, step in sorted(moments.items()):
            await anyio.sleep(moment - anyio.current_time())
            self.step += step


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> SteppedClocks:
    """time.time() is the stepped wall clock; clock_gettime the boot clock."""
    fake = SteppedClocks()
    monkeypatch.setattr(time, "time", fake.wall)
    monkeypatch.setattr(time, "clock_gettime", fake.boot)
    return fake


def server() -> tuple[Sandbox, Target]:
    """A sandbox enforcing RULE on run-query, 50 ms of round trip away."""
    table = limit_table(overrides=[parse_override(f"run-query={RULE}")])
    app = create_app(rules=table, clock=anyio.current_time)
    transport = Latency(asgi_transport(app), 0.05)
    where = Identity(base_url="http://sb")
    target = Target(identity=where, timeout=30.0, transport=transport)
    return app.state.sandbox, target


async def send(target: Target, ledger: Ledger, name: str, count: int) -> ListRecorder:
    """One process: `count` run-query jobs paced at RULE by `ledger` on the
    production clock."""
    recorder = ListRecorder()
    async with open_run(
        target,
        rules={LimitKey.RUN_QUERY: parse_rule(RULE)},
        settings=Settings(),
        ledger=ledger,
        clock=MachineClock(),
        sink=ListSink(),
        recorder=recorder,
        scope=name,
    ) as runner:
        jobs = [Job(f"{name}{n}", JobType.RUN_QUERY, "t", {}) for n in range(count)]
        await runner.run({LimitKey.RUN_QUERY: jobs}, {LimitKey.RUN_QUERY: count})
    return recorder


def shared_ledger(path) -> contextlib.closing[SqliteLedger]:
    """One process's SqliteLedger on `path`, on the production clock."""
    return contextlib.closing(
        SqliteLedger(path, client="c", hold=30.0, now=MachineClock().now)
    )


def test_the_machine_clock_does_not_follow_the_wall_clock(monkeypatch):
    """Setting the date moves time.time(), not MachineClock."""
    monkeypatch.setattr(time, "time", lambda: 0.0)
    before = MachineClock().now()
    monkeypatch.setattr(time, "time", lambda: 1e12)
    assert 0 <= MachineClock().now() - before < 60


def test_the_boot_id_names_this_boot():
    """On Linux the id is the kernel's, the same on every read."""
    assert boot_id() == boot_id()
    assert len(boot_id()) == 36


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param({1.5: 3600.0}, id="forward-1h"),
        pytest.param({1.5: -3600.0}, id="back-1h"),
        pytest.param({1.2: 0.5, 2.5: -3600.0, 3.7: 7200.0}, id="both-ways"),
    ],
)
async def test_a_step_mid_run_neither_breaks_the_rule_nor_stalls(
    clocks, tmp_path, steps
):
    """60 jobs at 10/1s with the wall clock stepped mid-run: never more than 10
    arrivals in any second at the server, and done in about the 5 s they need."""
    sandbox, target = server()
    start = anyio.current_time()
    with shared_ledger(tmp_path / "ledger.db") as ledger:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(clocks.step_at, steps)
            recorder = await send(target, ledger, "a", 60)
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 1.0) <= 10
    assert len(sandbox.arrivals) == 60
    assert anyio.current_time() - start < 6.5
    # What people read is the wall clock, steps and all.
    finished = [r.finished_at for r in recorder.results]
    assert all(r.status is Status.DONE for r in recorder.results)
    assert min(finished) > EPOCH + min(0.0, *steps.values())


async def test_two_processes_on_one_ledger_keep_the_rule_across_a_step(
    clocks, tmp_path
):
    """Two processes share one ledger file; the second starts after the wall clock
    jumped an hour ahead, and it steps an hour back while both send: together
    they stay within 10/1s at the server and finish without a stall."""
    sandbox, target = server()
    path = tmp_path / "ledger.db"
    start = anyio.current_time()

    async def later() -> None:
        await anyio.sleep(1.0)
        with shared_ledger(path) as ledger:
            await send(target, ledger, "b", 30)

    with shared_ledger(path) as ledger:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(clocks.step_at, {0.9: 3600.0, 2.0: -3600.0})
            tasks.start_soon(later)
            await send(target, ledger, "a", 30)
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 1.0) <= 10
    assert len(sandbox.arrivals) == 60
    # About 6 s of work; a stall would be an hour (the step).
    assert anyio.current_time() - start < 8.0


async def test_the_memory_ledger_of_a_sandbox_run_ignores_a_step(clocks):
    """The same for a one-process run (its ledger in memory), stepped back."""
    sandbox, target = server()
    start = anyio.current_time()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(clocks.step_at, {1.5: -3600.0})
        await send(target, MemoryLedger(), "m", 30)
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 1.0) <= 10
    assert anyio.current_time() - start < 3.5
