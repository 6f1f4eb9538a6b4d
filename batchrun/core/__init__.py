"""The values every wing speaks, with no I/O: the exception tree and its exit
codes, clocks, durations, strict JSON, a client's identity, limit rules (`Window`,
`Rule`, the grammar, profiles, the limit table) and the events a run reports.

May import: nothing of batchrun.
"""
