"""``python -m solver_planner`` runs the ``solver-planner`` command."""

from .cli import main

main()
