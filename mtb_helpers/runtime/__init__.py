"""Rank processes: ``run(fn, world_size=t)`` (ranks.py) on a warm pool (pool.py) of forkserver
workers (worker.py), with rank failures and hangs turned into errors that name the rank (errors.py),
or inside a job that torchrun launched (launched.py)."""
