"""What a plan costs: cost models (``costs``), the machine model folded into them (``machine``), which part of a
task holds which resource (``taskmodel``), the discrete-event simulator (``simulate``, ``_simcore``), bytes in flight
(``memory``), task graphs and plan files (``graph``) and what-if studies (``whatif``)."""
