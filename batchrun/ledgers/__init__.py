"""The shared send logs behind the pacer's `Ledger` protocol: SQLite for every
process on a machine, Redis for several machines, and the choice by `--ledger URL`.

May import: core, pacing, store.
"""
