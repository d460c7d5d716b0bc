"""The search for the best plan.

The entry point ``auto_schedule`` (``entry``) with its options (``options``) and report (``report``);
one plan search (``core``): the searchers' phases (``phases``) and the judgement of their plan
(``judge``); the two searches the entry point dispatches to, which call the core in turn: with
inferred dependencies (``inferred``) and under a memory cap (``memcap``, its trade-off in
``tradeoff``). Beneath them: the problem (``problem``) and its plans (``plans``), lower bounds
(``bounds``), the modulo timetable (``modulo``), starting points and moves (``presets``, ``moves``,
``seeds``), scoring (``scoring``), and the searchers: beam search (``beam``), CP-SAT (``cpsat``, its
model ``cpsat_model``, its reading ``cpsat_read``) and brute force (``enumerate``).
"""
