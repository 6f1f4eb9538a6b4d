"""Learning a key's real limit from what the server accepted and what it refused.

The model: the server enforces some rule no looser than the one given; a 429 is
its one certain word. Each key's requests are logged (`log.KeyLog`); once a 429
episode has settled, the log is explained by the simplest reading that fits every
refusal and contradicts no acceptance (`learner.Learner.review`):

- one window COUNT/W (`readings.infer`), W among the rule's own windows, the
  lengths the API uses and the windows the server names (`readings.heard_windows`);
  a burst fits any window longer than it lasted, so the safe (longest) reading is
  kept behind a faster one (`alternatives`: a shorter window, a leaky bucket) as a
  `fallback.Fallback` that one more request settles;
- refused although the rule held: the rule counted another way (an aligned fixed
  window or weighted counter, `counters.read`), which spacing evenly answers; still
  refused when spaced, a quota or a lowered count (`alternatives.lowered`).

Invariant: a lesson only ever adds a window or lowers a count, so the rule it gives
never allows more than the rule it came from; the one looser reading, a leaky
bucket's burst, stands only with a window reading to fall back to. Lessons and
what the server was seen to accept are kept in the ledger as text (`storage`),
read back only for the rule they were learned under.

A lesson needs evidence (`evidence`): a refusal that the server's own record
contradicts is noise and teaches nothing; one refusal alone is only tried in
this process, never kept.

Modules, bottom up: log, lessons, counters; readings; alternatives; storage,
fallback, evidence; learner.
"""
