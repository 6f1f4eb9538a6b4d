"""A run's orchestration: the workers that take a slot, send, and hand each
outcome to the journal (results file and run store in step).

May import: core, pacing, jobs, api, store.
"""
