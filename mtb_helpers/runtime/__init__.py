"""Rank processes: ``run(fn, world_size=t)`` (ranks.py) on a warm pool (pool.py) of forkserver
workers (worker.py) started with what ranks share preloaded (start.py, forkserver_setup.py;
on Linux the forkserver is a fork of the owner, fork_helper.py), with
rank failures and hangs turned into errors that name the rank (errors.py), interrupts and SIGTERM
handled (signals.py), or inside a job that torchrun launched (launched.py). ``run(...,
link=...)`` emulates a link (link.py): each rank's torch.distributed ops go through stand-ins
(link_ops.py) on a communication thread (comm_thread.py) and take their modelled time, recorded
as a timeline (timeline.py)."""
