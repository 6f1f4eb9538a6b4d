"""The local copy of the API: the Starlette app that enforces limits as a
chosen server model would, the faults it injects, the headers it states, and serving
it on loopback with uvicorn.

May import: core, pacing, jobs.
"""
