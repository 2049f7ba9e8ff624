"""The names each option accepts, in one light module.

The library modules that give these names meaning import them from here, and so does the
command line, which can then declare its options without importing the solvers (a command
starts in a fraction of a second; the solvers load when the command runs).
"""

__all__ = ["STAGE_METHODS", "SCHEDULES", "RESHARD_METHODS", "RESHARD_STRATEGIES", "CROSS_MESH", "SIZE_METRICS", "ENGINES",
           "COMPUTE_MODELS", "DEFAULT_BUDGET", "DEFAULT_SIMULATIONS",
           "DEFAULT_TOP_GAP", "DEFAULT_GAP", "STALL", "RISE"]

STAGE_METHODS = ("auto", "dp", "cp-sat", "greedy", "brute-force")
SCHEDULES = ("1f1b", "gpipe", "eager-1f1b", "interleaved-1f1b", "zb-h1", "zb-v")
RESHARD_METHODS = ("auto", "cp-sat", "naive", "load-balance", "dfs", "greedy", "alpa-greedy", "dispatch")
RESHARD_STRATEGIES = ("broadcast", "send-recv", "local-allgather", "global-allgather")
# How a plan's stage boundaries move their tensors (the rows of the resharding paper's ablation).
CROSS_MESH = ("broadcast", "send-recv", "free")
SIZE_METRICS = ("instructions", "paper")
# How `reduce verify` decides a program: a z3 proof over symbolic data, or the rules applied.
ENGINES = ("z3", "semantics")
# How compute is timed (solver_planner.compute): kernel efficiency and memory traffic (the
# roofline when the device has no compute block), the bare roofline, or FLOPs at peak.
COMPUTE_MODELS = ("efficiency", "roofline", "peak")
DEFAULT_BUDGET = 2000          # subspaces the stage search solves before it stops with a gap
DEFAULT_SIMULATIONS = 300_000  # simulated tasks per listed plan before the stage search stops with a gap
DEFAULT_TOP_GAP = 0.01         # relative: a listed plan after the first is its pair's best within this
DEFAULT_GAP = 0.01             # relative: the stage search stops at this gap once its bound stops rising
STALL = 64   # the stage search's bound has stopped rising after STALL subspaces
RISE = 1e-3  # that together raised the bound of what is left by less than RISE (relative)
