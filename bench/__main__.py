"""`python -m bench`: every measurement, its table, bench/results/results.json."""

from bench.run import main

main()
