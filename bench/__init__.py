"""Benchmarks of batchrun against the tools people use instead (issue 5).

Run everything with `python -m bench` from the repository root; see BENCHMARKS.md.
"""
