"""The search for the best plan: ``auto_schedule`` and its report (``entry``), the problem it solves (``problem``),
lower bounds (``bounds``), the modulo timetable (``modulo``), starting points (``presets``, ``seeds``), the
searchers (``beam``, ``cpsat``, ``enumerate``), and the two searches that call the entry point: with inferred
dependencies (``inferred``) and under a memory cap (``memcap``)."""
