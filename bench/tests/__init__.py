"""The benchmarks' own tests: their checks can fail, and they run."""
