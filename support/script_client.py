"""The reference script client of issue 36: what a careful short script does.

A sliding log of the told rule counted from each send, at most 8 requests in
flight, and on a 429 a retry after its Retry-After when it gives one, else after
0.5, 1, 2, 4 s (then 4 s on); it reads no other header and keeps no memory
between runs. It runs on trio's virtual clock against `simulation`'s `_Server`, as
`simulate` runs batchrun, and returns the same `Simulated` (429s counted by the
server's arrivals; the tally counts done jobs and 429s).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import anyio
import trio
import trio.testing

from batchrun.core.events import Tally
from batchrun.core.limits import Rule, parse_rule
from support.simulation import BOUND, Network, Server, Simulated, ideal, jobs, sender

BACKOFF = (0.5, 1.0, 2.0, 4.0)
# A server that does nothing beyond the round trip, over an untraced transport.
PLAIN = Network()


def script(
    *,
    client: Rule | str,
    server: Server,
    count: int = 60,
    concurrency: int = 8,
    latency: tuple[float, float] = (0.005, 0.05),
    seed: int = 0,
    bound: float = BOUND,
    network: Network = PLAIN,
) -> Simulated:
    """One run of `count` jobs by the script, told `client`'s rule (`network`:
    what the server does beyond the round trip; the script reads no trace)."""
    rule = parse_rule(client) if isinstance(client, str) else client
    trio._core._run._r.seed(seed)
    run = _Script(rule, server, count, concurrency, latency, seed, bound, network)
    clock = trio.testing.MockClock(autojump_threshold=0)
    result: Simulated = anyio.run(
        run.main, backend="trio", backend_options={"clock": clock}
    )
    return result


@dataclass(slots=True)
class _Script:
    rule: Rule
    server: Server
    count: int
    concurrency: int
    latency: tuple[float, float]
    seed: int
    bound: float
    network: Network

    async def main(self) -> Simulated:
        fake = sender(
            self.server, latency=self.latency, seed=self.seed, network=self.network
        )
        start = anyio.current_time()
        todo, sends = deque(jobs(self.count)), deque[float]()
        tally = Tally(total=self.count)
        # One worker at a time waits for the next slot, first come first served
        # (trio breaks ties between equal deadlines by memory address).
        gate = anyio.Lock()

        async def slot() -> None:
            """Wait until one more send fits every window of the rule; take it."""
            async with gate:
                await fits()

        async def fits() -> None:
            while True:
                now = anyio.current_time()
                waits = [
                    sends[-w.count] + w.seconds - now
                    for w in self.rule.windows
                    if len(sends) >= w.count and sends[-w.count] + w.seconds > now
                ]
                if not waits:
                    sends.append(now)
                    return
                await anyio.sleep(max(waits))

        async def worker() -> None:
            while todo:
                job, tries = todo.popleft(), 0
                while True:
                    await slot()
                    outcome = await fake.send(job)
                    if outcome.status != 429:
                        break
                    tally.rate_limited += 1
                    hints = outcome.hints
                    told = outcome.retry_after if hints is None else hints.retry_after
                    await anyio.sleep(BACKOFF[min(tries, 3)] if told is None else told)
                    tries += 1
                tally.done += 1

        async with anyio.create_task_group() as rival:
            rival.start_soon(fake.rival)
            with anyio.move_on_after(self.bound):
                async with anyio.create_task_group() as workers:
                    for _ in range(self.concurrency):
                        workers.start_soon(worker)
            makespan = anyio.current_time() - start
            rival.cancel_scope.cancel()
        return Simulated(
            arrivals=tuple(fake.arrivals),
            makespan=makespan,
            ideal=ideal(self.server, self.count),
            tally=tally,
            ended={},
            bound=self.bound,
            answers=tuple(fake.answers),
        )
