"""Pictures of the planner's answers: matplotlib figures and the HTML report of a plan.

Reads results, never solves (DESIGN.md): every function takes what a command already
computed (ranked placements, a verdict and its trace, a resharding plan, a simulated
pipeline) and draws it.  One module per kind of picture:

==============  =============================================================
``placement``   device maps coloured by axis coordinate; AllReduce vs best program
``program``     a reduction program step by step; the counterexample highlighted
``resharding``  Gantt chart of a broadcast schedule per port, beside the naive one
``pipeline``    pipeline Gantt per stage, memory per stage, where the time goes
``html``        one self-contained HTML report of a plan (inline SVG)
==============  =============================================================

matplotlib is an optional dependency (``pip install 'solver-planner[plot]'``); it is
imported when a picture is drawn, never at ``import solver_planner``.  Pictures are
deterministic: the same inputs give the same SVG bytes (:mod:`.style`).
"""

from .style import prepare, require, save

__all__ = ["prepare", "require", "save"]
