"""`python -m bench`: run every measurement, print the table, write results.json."""

from bench.run import main

main()
