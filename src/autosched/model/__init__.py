"""What a plan costs: cost models (``costs``; one task's cost in ``taskcost``), the machine model folded into them
(``machine``), which part of a task holds which resource (``taskmodel``), the discrete-event simulator (``simulate``;
its event machine ``_simcore`` with its host side ``_simhost``, device side ``_simdevice`` and events ``_simevents``),
bytes in flight (``memory``), task graphs and plan files (``graph``) and what-if studies (``whatif``)."""
