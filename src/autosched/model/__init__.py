"""What a plan costs: cost models (``costs``; one task's cost in ``taskcost``), the machine model folded into them
(``machine``), which part of a task holds which resource (``taskmodel``), the discrete-event simulator (``simulate``;
the plan as it reads it ``_simplan``, its event machine ``_simcore`` and its events ``_simevents``),
bytes in flight (``memory``), task graphs and plan files (``graph``) and what-if studies (``whatif``)."""
