"""Reduction programs (P² §3.2-3.5): DSL, semantics, synthesis hierarchy, synthesis."""

from .dsl import Instruction, Program, format_program, parse_program
from .hierarchy import Form, Lowering, SynthesisHierarchy
from .semantics import Semantics, State, Violation
from .synthesis import candidates, run_on_hierarchy, synthesize

__all__ = [
    "Instruction", "Program", "format_program", "parse_program", "Form", "Lowering", "SynthesisHierarchy",
    "Semantics", "State", "Violation", "candidates", "run_on_hierarchy", "synthesize",
]
