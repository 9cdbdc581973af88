"""How a check judges a distributed run: one Report (report.py), the per-step trace of a layer
(trace.py), dtypes and tolerances (tolerances.py), and the registry of deliberate bugs
(bug.py, filled from each topic's bugs.py by the manifest)."""
