"""What the commands that send nothing read: a run's standing, its plan, one job,
and what a client's ledger learned of its limits, as values the command line
renders.

May import: core, pacing, jobs, store, ledgers.
"""
