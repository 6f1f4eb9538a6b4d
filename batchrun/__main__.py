"""`python -m batchrun`."""

from batchrun.cli.commands import main

main()
