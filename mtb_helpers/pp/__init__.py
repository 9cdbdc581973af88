"""Pipeline parallelism (notebook 05): schedules and the simulator of their timelines."""
from mtb_helpers.pp.schedules import SCHEDULES, Op, Schedule, closed_form, schedule, warmup_count
from mtb_helpers.pp.simulator import Event, Timeline, simulate

__all__ = ["Op", "Schedule", "SCHEDULES", "schedule", "simulate", "Timeline", "Event",
           "warmup_count", "closed_form"]
