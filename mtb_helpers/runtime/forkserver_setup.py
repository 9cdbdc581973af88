"""Imported last by the forkserver (see start.py), before it forks any rank; does nothing
elsewhere (start.py sets MTB_FORKSERVER_SETUP only while ranks start).

* ``gc.freeze()``: every object built so far (torch, the course modules) moves to the garbage
  collector's permanent generation. Forked ranks then never scan them, so the pages holding them
  stay shared with the forkserver instead of being copied into every rank. (A forkserver forked
  from the owner has frozen the owner's objects already, fork_helper.py; there this module does
  not even run if the owner had imported it, as the tests' ``no_ranks`` fixture does.)
* ``os.setpgrp()``: the forkserver and its ranks leave the kernel's process group. ipykernel's
  shutdown sends SIGTERM to the processes of its group and waits (up to seconds) until none is
  left; out of the group, the kernel exits at once and its exit handler stops the pools. Ranks
  still die with their owner (lifeline) and ignore Ctrl-C. (start.py already starts the forkserver
  in a session of its own where it can; then this fails harmlessly: a session leader is already
  alone in its group.)
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
