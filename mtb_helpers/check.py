"""Every check of the course, from one import path::

    from mtb_helpers.check import check_tp_mlp, check_data_parallel, ...

Each lives in its topic folder (``mtb_helpers/<topic>/check.py``); this module only gathers them.
"""
from mtb_helpers.capstone.check import check_capstone
from mtb_helpers.collectives.check import check_collectives
from mtb_helpers.cp.check import check_context_parallel
from mtb_helpers.dp.check import check_data_parallel
from mtb_helpers.grid.check import check_grid
from mtb_helpers.moe.check import check_moe
from mtb_helpers.pp.check import check_pipeline
from mtb_helpers.sp.check import check_sequence_parallel
from mtb_helpers.tp.check import check_column_parallel, check_row_parallel, check_tp_mlp
from mtb_helpers.tp.attention_check import check_tp_attention
from mtb_helpers.tp.vocab_check import check_vocab_parallel

__all__ = ["check_collectives", "check_column_parallel", "check_row_parallel", "check_tp_mlp",
           "check_sequence_parallel", "check_data_parallel", "check_moe", "check_grid",
           "check_tp_attention", "check_vocab_parallel",
           "check_context_parallel", "check_pipeline", "check_capstone"]
