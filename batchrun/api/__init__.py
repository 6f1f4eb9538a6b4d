"""Talking to the API: what rate-limit headers say, the outcome of one attempt,
the circuit breaker, and the HTTP client (the only httpx user).

May import: core, jobs.
"""
