"""`python -m batchrun`."""

from batchrun.cli import main

main()
