"""Imported last by the forkserver (start.py), before it forks any rank; does nothing elsewhere
(start.py sets MTB_FORKSERVER_SETUP only while ranks start).

* ``gc.freeze()``: every object built so far (torch, the course modules) moves to the collector's
  permanent generation, so forked ranks never scan them and their pages stay shared instead of
  being copied into every rank (a forkserver forked from the owner froze them already).
* ``os.setpgrp()``: out of the kernel's process group, which ipykernel's shutdown signals and waits
  for (up to seconds). Ranks still die with their owner (lifeline) and ignore Ctrl-C. Where start.py
  already started the forkserver in a session of its own this fails harmlessly.
"""
import gc
import os

if os.environ.get("MTB_FORKSERVER_SETUP") == "1":
    gc.collect()
    gc.freeze()
    if hasattr(os, "setpgrp"):
        try:
            os.setpgrp()
        except OSError:
            pass
