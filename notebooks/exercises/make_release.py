"""Regenerate the student release of the course kit (notebooks/exercises/release/*.ipynb) and build the student package.

    python notebooks/exercises/make_release.py                    # rewrite release/ from the source notebooks
    python notebooks/exercises/make_release.py --check            # exit 1 if release/ is stale (what the test runs)
    python notebooks/exercises/make_release.py --student ../minirl-student   # the folder a teacher hands out
    python notebooks/exercises/make_release.py --table            # the page's table of solution cells

The release is what `nbgrader generate_assignment` makes from the source notebooks (solutions replaced by
`raise NotImplementedError()`, hidden tests removed, outputs cleared), generated in a temporary course directory,
with one change: the link to the companion lesson becomes its file name (from release/ the link led to the source
notebook, solutions included). Needs the [course] extra (nbgrader).

The student package (``--student DIR``, a folder outside the repository; no nbgrader needed) is everything a student
needs and no answer: minirl's package with the checker's answer key replaced by a stand-in (the cases that compare
with it are deferred to grading), the data and stored results the lessons read, the lessons with every cell that
prints an exercise's solution replaced by a pointer to the exercise, and the stored release as
notebooks/exercises/. ``student_package.py`` beside this file does the work; tests/test_exercise_notebooks.py checks
that no solution reaches it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RELEASE = HERE / "release"
ASSIGNMENT = "minirl"


def _canonical(text: str) -> str:
    """The notebook as stored: sorted keys, one-space indent, no nbgrader cell checksums' noise."""
    return json.dumps(json.loads(text), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def generate() -> dict[str, str]:
    """{file name: notebook text} of the release, made by nbgrader in a temporary course directory."""
    with tempfile.TemporaryDirectory() as tmp:
        course = Path(tmp)
        (course / "source" / ASSIGNMENT).mkdir(parents=True)
        for path in sorted(HERE.glob("*.ipynb")):
            shutil.copy(path, course / "source" / ASSIGNMENT / path.name)
        (course / "nbgrader_config.py").write_text(
            f"c = get_config()\nc.CourseDirectory.root = {str(course)!r}\nc.CourseDirectory.course_id = 'minirl'\n")
        env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        proc = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", ASSIGNMENT, "--force",
                               f"--CourseDirectory.root={course}"], cwd=course, env=env, capture_output=True,
                              text=True, timeout=600)
        if proc.returncode:
            raise RuntimeError(f"nbgrader generate_assignment failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        return {p.name: _canonical(_unlink_lessons(p.read_text()))
                for p in sorted((course / "release" / ASSIGNMENT).glob("*.ipynb"))}


LESSON_LINK = re.compile(r"\[`?(\d\d_[a-z_]+\.ipynb)`?\]\(\.\./\1\)")


def _unlink_lessons(text: str) -> str:
    """The release's links to a companion lesson, as plain file names: from release/ the relative link led to the
    source notebook of this folder (solutions included); in the student package the lesson sits one folder up."""
    nb = json.loads(text)
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = LESSON_LINK.sub(r"`\1` (the lesson in the folder above this one)", src)
    return json.dumps(nb)


def stale(release: dict[str, str]) -> list[str]:
    """Names of the release notebooks that differ from the stored ones (or are missing / extra)."""
    stored = {p.name: p.read_text() for p in RELEASE.glob("*.ipynb")}
    return sorted(n for n in set(stored) | set(release) if stored.get(n) != release.get(n))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Regenerate (or --check) notebooks/exercises/release/.")
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when the stored release is stale")
    p.add_argument("--student", metavar="DIR", help="build the student package in DIR (from the stored release)")
    p.add_argument("--table", action="store_true", help="regenerate the teacher's page's table of solution cells")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import student_package

    if args.table:
        student_package.write_table()
        print(f"rewrote the table of solution cells in {HERE / 'README.md'}")
        return 0
    if args.student:
        report = student_package.build(Path(args.student))
        print(report)
        return 0
    release = generate()
    if args.check:
        names = stale(release)
        print("release is up to date" if not names else f"release is stale: {names}; run {Path(__file__).name}")
        return 1 if names else 0
    RELEASE.mkdir(exist_ok=True)
    for old in RELEASE.glob("*.ipynb"):
        old.unlink()
    for name, text in release.items():
        (RELEASE / name).write_text(text)
    print(f"wrote {len(release)} notebooks to {RELEASE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
