"""The stored student release holds stubs that raise NotImplementedError by design: nbval does not run it
(tests/test_exercise_notebooks.py grades it with nbgrader instead)."""

collect_ignore = ["release", "make_release.py", "student_package.py"]
