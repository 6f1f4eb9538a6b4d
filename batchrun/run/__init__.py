"""A run's orchestration: one `submit` from lock to exit code, the workers that
take a slot, send, settle each outcome and learn from it, and the journal that
keeps the results file and the run store in step. The view a run is shown in is
given by its caller.

May import: core, pacing, jobs, api, store, ledgers.
"""
