"""Pipeline parallelism: schedules and the simulator of their timelines (notebook 05), and the
pipeline on real ranks with its check (notebook 09)."""
from mtb_helpers.pp.schedules import SCHEDULES, Op, Schedule, closed_form, schedule, warmup_count
from mtb_helpers.pp.simulator import Event, Timeline, simulate
from mtb_helpers.pp.runtime import PipelineResult, TimelineEvent, pipeline_step

__all__ = ["Op", "Schedule", "SCHEDULES", "schedule", "simulate", "Timeline", "Event",
           "warmup_count", "closed_form", "pipeline_step", "PipelineResult", "TimelineEvent",
           "check_pipeline"]


def __getattr__(name: str):
    # check_pipeline is imported on first use: the checking package gathers every topic's bugs
    # (including mtb_helpers.pp.bugs), so importing the check here would be a circle at start-up.
    if name == "check_pipeline":
        from mtb_helpers.pp.check import check_pipeline
        return check_pipeline
    raise AttributeError(f"module 'mtb_helpers.pp' has no attribute {name!r}")
