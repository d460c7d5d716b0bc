"""Verification on the engine: which plans are measured (``candidates``), their predictions with the search's model
(``predict``), their measurement side by side (``measure``), the hook that keeps the fastest (``loop``), and the
core pool refitted to what was measured (``refit``)."""
