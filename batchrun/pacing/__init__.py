"""When a request may leave: the slot rule as pure math, the models of how
servers count, the `Ledger` protocol and its in-memory ledger, the learner that reads a
stricter server from its answers, and the pacer that grants slots per key.

May import: core.
"""
