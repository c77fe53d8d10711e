"""The one error type that reaches an operator.

Everything a user can get wrong (a path, a model name, a device, a corrupt
file) is raised as `EdgeAgentError` at the boundary where it is detected, with
a `fix` that says what to do. The CLI prints it as one line and exits non-zero;
the agent will answer a command with it. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class EdgeAgentError(Exception):
    """A problem the operator can fix, with the fix."""

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.problem}; {self.fix}" if self.fix else self.problem
