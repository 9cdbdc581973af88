"""The collectives primer (notebook 00): the five collectives on real ranks and their bytes."""
from mtb_helpers.collectives import bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)
