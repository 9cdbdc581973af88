"""Notebook 14's cells import its bugs from here; they live in dp/bugs.py, dp's one bug module."""
from mtb_helpers.dp.bugs import OVERLAP_BUGS, BucketTooEarly, NoWait, PrefetchWrongModule

__all__ = ["OVERLAP_BUGS", "BucketTooEarly", "NoWait", "PrefetchWrongModule"]
