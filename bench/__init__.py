"""Benchmarks of batchrun against the tools people use instead (issue 5).

Run everything with `python -m bench` from the repository root; the figures and
how each is measured are in docs/benchmarks/.
"""
