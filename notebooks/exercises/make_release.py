"""Regenerate the student release of the course kit: notebooks/exercises/release/*.ipynb.

    python notebooks/exercises/make_release.py           # rewrite release/ from the source notebooks
    python notebooks/exercises/make_release.py --check   # exit 1 if release/ is stale (what the test runs)

The release is exactly what `nbgrader generate_assignment` makes from the source notebooks (solutions replaced by
`raise NotImplementedError()`, hidden tests removed, outputs cleared), generated in a temporary course directory, so
a teacher without nbgrader can hand it out as is. Needs the [course] extra (nbgrader).
"""

from __future__ import annotations

import argparse
import json
import os
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
        return {p.name: _canonical(p.read_text()) for p in sorted((course / "release" / ASSIGNMENT).glob("*.ipynb"))}


def stale(release: dict[str, str]) -> list[str]:
    """Names of the release notebooks that differ from the stored ones (or are missing / extra)."""
    stored = {p.name: p.read_text() for p in RELEASE.glob("*.ipynb")}
    return sorted(n for n in set(stored) | set(release) if stored.get(n) != release.get(n))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Regenerate (or --check) notebooks/exercises/release/.")
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when the stored release is stale")
    args = p.parse_args(argv)
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
