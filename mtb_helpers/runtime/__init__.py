"""Rank processes: ``run(fn, world_size=t)`` (ranks.py) on a warm pool (pool.py) of forkserver
workers (worker.py) started with what ranks share preloaded (start.py, forkserver_setup.py;
on Linux the forkserver is a fork of the owner, fork_helper.py), with
rank failures and hangs turned into errors that name the rank (errors.py), interrupts and SIGTERM
handled (signals.py), or inside a job that torchrun launched (launched.py)."""
