"""The capstone (notebook 12): a tiny GPT trained under tp x pp x dp x cp, equal to one process.

model.py (the single-process GPT), data.py (the shipped text), reference.py (AdamW on one
process), grid.py (the 4D rank grid and its groups), layers.py (the model rebuilt from the
course's parallel layers), finalize.py (SP's LayerNorm / bias grads, one all-reduce a step),
parallel.py (``train_parallel``), validate.py, bugs.py, check.py (``check_capstone``), plots.py,
widget.py, cli.py (``minitrainbench train``)."""
from mtb_helpers.capstone.data import VOCAB, batch_for_step, corpus, decode, encode
from mtb_helpers.capstone.grid import Grid, GridLayout, group_ranks
from mtb_helpers.capstone.model import GPTConfig, TinyGPT, make_model
from mtb_helpers.capstone.parallel import ParallelRun, train_parallel
from mtb_helpers.capstone.reference import TrainConfig, train_reference
from mtb_helpers.capstone.validate import admissible_layouts, validate
from mtb_helpers.capstone import bugs  # noqa: F401  registers the topic's bugs (checking/bug.py)

__all__ = ["VOCAB", "batch_for_step", "corpus", "decode", "encode", "Grid", "GridLayout",
           "group_ranks", "GPTConfig", "TinyGPT", "make_model", "ParallelRun",
           "train_parallel", "TrainConfig", "train_reference", "admissible_layouts", "validate"]
