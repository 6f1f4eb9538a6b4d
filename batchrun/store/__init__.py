"""What a run keeps on disk: the SQLite files and their migrations, the state
folder's paths, the per-file lock, the results file, the
run store of jobs and their states, and which run store a jobs file uses.

May import: core, jobs, api.
"""
