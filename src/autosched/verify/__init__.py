"""Verification on the engine: candidate plans measured side by side, predicted with the search's model, the
fastest kept (``loop``), and the core pool refitted to what was measured (``refit``)."""
