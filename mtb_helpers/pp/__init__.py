"""Pipeline parallelism: schedules and the simulator of their timelines (notebook 05), and the
pipeline on real ranks with its check (notebook 09)."""
from mtb_helpers.pp.schedules import SCHEDULES, Op, Schedule, closed_form, schedule, warmup_count
from mtb_helpers.pp.simulator import Timeline, TimelineEvent, simulate
from mtb_helpers.pp.runtime import PipelineResult, pipeline_step
from mtb_helpers.pp.check import check_pipeline
from mtb_helpers.pp import bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)

__all__ = ["Op", "Schedule", "SCHEDULES", "schedule", "simulate", "Timeline",
           "warmup_count", "closed_form", "pipeline_step", "PipelineResult", "TimelineEvent",
           "check_pipeline"]

