"""What the tests and the benchmarks share, imported by both (`tests/` does not
import `bench`, nor `bench` import `tests`): the simulation on a virtual clock and
the script client it is measured against, the oracles, the stock limiters served
over loopback, the sandbox's case servers and the benchmark's cases, the mixed
request jobs and the two-host Redis driver. Nothing in batchrun imports it.
"""
