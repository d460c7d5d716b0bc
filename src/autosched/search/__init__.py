"""The search for the best plan.

``auto_schedule`` (``autoschedule``) holds the search's steps in one function: build the problem (``problem``),
run the searchers (``searchers``), repair the plan's gradient streams (``gradstreams``) and assess it
(``assess``: the ``SearchReport`` of ``report``), verify it on the engine (``autosched.verify``); under a memory
cap, once per depth cap (``memcap``, its trade-off in ``tradeoff``). Its options are in ``options``.

Every searcher returns a ``Found`` (``found``): the beam search (``beam``: modulo list scheduling in ``modulo``,
candidates scored in ``scoring``, fire orders in ``fire_orders``, thread and stream maps in ``maps``, the beam's
moves in ``neighbours``), CP-SAT (``cpsat``, its model ``cpsat_model``, its reading ``cpsat_read``) and the seed
plans (``seeds``). Beneath them: lower bounds (``bounds``) and plans from the searchers' choices (``plans``).
The brute force the tests hold the searchers to is ``swpipe.testing.plan_space``.
"""
