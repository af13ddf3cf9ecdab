"""The course kit's checker: ``check("gae", my_gae)`` grades a student's function on hidden cases.

Each exercise of ``notebooks/exercises/`` asks for one function that minirl implements; ``ch00`` .. ``ch15`` hold
their cases, chapter by chapter, and ``_core`` the machinery (see its docstring for how a case reports a mistake).
``grade`` regrades submitted notebooks outside the student's kernel (``python -m minirl.exercises.grade``), where a
solution cell cannot replace the checker.

Usage in a notebook::

    from minirl import exercises
    exercises.check("gae", gae)          # prints "gae: all 5 cases passed", or raises AssertionError
    exercises.EXERCISES["gae"].case_names()   # what is checked (not how)
"""

# each chapter's module adds its exercises to EXERCISES
from . import ch00, ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, ch11, ch12, ch13, ch14, ch15  # noqa: F401
from ._core import EXERCISES, Exercise, check, list_exercises, watch_all

watch_all()  # fingerprint the checker before any student code runs (the import is a notebook's first cell)

__all__ = ["EXERCISES", "Exercise", "check", "list_exercises"]
