"""The course's helpers: live widgets, plots, exercises and their checkers, the χ² harness, broken
rules (negative controls), timing and diagnostics, and ``record`` for the notebooks' checked claims."""
