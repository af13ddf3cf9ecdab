"""Helper of .ci/gpu_check.sh (standard library only, plus ``packaging``, which pip always carries).

    python .ci/gpu_check.py plan WHEEL_DIR     # print the wheels to install: those the environment lacks
    python .ci/gpu_check.py verify WHEEL_DIR   # every shipped package's requirements met? exit 1 if one is absent
    python .ci/gpu_check.py summary WORK_DIR   # the closing block of figures, from the parts' files

A wheel is installed only where the environment lacks its package, or where the environment's version breaks a
requirement of another shipped package and the shipped wheel meets it; packages that torch or transformers need
are never replaced (a conflict there is reported instead).
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import json
import re
import statistics
import sys
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # pip vendors it
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

PROTECTED_BY = ("torch", "transformers", "tokenizers")  # the image's stack: their requirements are left alone


def wheel_meta(path: Path) -> tuple[str, str, list[Requirement]]:
    """(canonical name, version, requirements) read from a wheel's METADATA."""
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    return canonicalize_name(meta["Name"]), meta["Version"], requires


def applies(req: Requirement) -> bool:
    """The requirement holds here without extras (markers evaluated for this interpreter)."""
    return req.marker is None or req.marker.evaluate({"extra": ""})


def installed() -> dict[str, str]:
    return {canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()
            if d.metadata["Name"]}


def shipped(wheel_dir: str) -> dict[str, tuple[Path, str, list[Requirement]]]:
    out = {}
    for path in sorted(Path(wheel_dir).glob("*.whl")):
        name, version, reqs = wheel_meta(path)
        if name in out:
            sys.exit(f"gpu_check: two wheels of {name} in {wheel_dir}; keep one")
        out[name] = (path, version, reqs)
    return out


def protected(have: dict[str, str]) -> set[str]:
    names = set(PROTECTED_BY)
    for top in PROTECTED_BY:
        if top in have:
            names |= {canonicalize_name(req.name) for req in map(Requirement, importlib.metadata.requires(top) or [])
                      if applies(req)}
    return names


def plan(wheel_dir: str) -> int:
    ships, have = shipped(wheel_dir), installed()
    keep_out = protected(have)
    chosen = {n for n in ships if n not in have}
    changed = True
    while changed:  # replace an image package only where a shipped requirement rules its version out
        changed = False
        for name in [n for n in ships if n in chosen or n in have]:
            for req in ships[name][2]:
                dep = canonicalize_name(req.name)
                if not applies(req) or dep in chosen or dep not in have or dep not in ships:
                    continue
                if have[dep] not in req.specifier and ships[dep][1] in req.specifier and dep not in keep_out:
                    print(f"gpu_check: replacing {dep} {have[dep]} by {ships[dep][1]} ({name} needs {req})",
                          file=sys.stderr)
                    chosen.add(dep)
                    changed = True
    kept = sorted(n for n in ships if n not in chosen)
    print(f"gpu_check: {len(chosen)} of {len(ships)} wheels to install; the environment already has "
          f"{len(kept)}: " + ", ".join(f"{n} {have[n]}" for n in kept), file=sys.stderr)
    for name in sorted(chosen):
        print(ships[name][0])
    return 0


def verify(wheel_dir: str) -> int:
    """Check the requirements of every shipped package, and theirs that are not shipped (pyarrow, pandas, ...)."""
    ships, have = shipped(wheel_dir), installed()
    missing, mismatched, seen = [], [], set()
    todo = [n for n in ships if n in have]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for req in importlib.metadata.requires(name) or []:
            req = Requirement(req)
            if not applies(req):
                continue
            dep = canonicalize_name(req.name)
            if dep not in have:
                missing.append(f"{name} needs {req}: not installed")
            elif req.specifier and not req.specifier.contains(Version(have[dep]), prereleases=True):
                mismatched.append(f"{name} needs {req}, the environment has {have[dep]}")
            elif dep not in ships:
                todo.append(dep)  # an image package the shipped ones need: its own needs too
    not_installed = sorted(n for n in ships if n not in have)
    for line in missing:
        print(f"gpu_check: MISSING: {line}")
    for line in mismatched:
        print(f"gpu_check: WARNING (version; the import check decides): {line}")
    if not_installed:
        print(f"gpu_check: MISSING: shipped but not installed: {', '.join(not_installed)}")
    print(f"gpu_check: requirements of {len(seen)} packages checked: {len(missing) + len(not_installed)} missing, "
          f"{len(mismatched)} version warnings")
    return 1 if missing or not_installed else 0


# ------------------------------------------------------------------------------------------------ summary
def _pytest_line(log: Path) -> str:
    """The closing line of a pytest run ('12 passed, 1 failed in 80.1s'), or '' if it has none."""
    lines = [ln.strip("= ").strip() for ln in log.read_text(errors="replace").splitlines()] if log.exists() else []
    done = [ln for ln in lines if re.search(r"\b(passed|failed|error|errors|no tests ran)\b.* in [0-9.]+s", ln)]
    return done[-1] if done else ""


def _bench_lines(bench: dict) -> list[str]:
    out = [f"  {bench.get('batch', '')}; device {bench.get('gpu', bench.get('device', '?'))}, "
           f"torch {bench.get('torch', '?')}"]
    for kind in ("dense", "moe"):
        r = bench.get(kind)
        if not isinstance(r, dict):
            continue
        secs = r.get("seconds", {})
        parts = "  ".join(f"{k} {v:.4f}" for k, v in secs.items() if isinstance(v, (int, float)))
        extra = {k: r[k] for k in ("parameters", "generated_tokens_per_s", "step_tokens_per_s", "peak_memory_mb")
                 if k in r}
        out.append(f"  {kind:5s} seconds (median): {parts}")
        out.append(f"  {kind:5s} " + "  ".join(f"{k} {v}" for k, v in extra.items()))
    return out


def _train_lines(work: Path) -> list[str]:
    s = json.loads((work / "train" / "summary.json").read_text())
    b, a = s["before"], s["after"]
    out = [f"  {s['algo']}, profile {s['profile']}, seed {s['seed']}, {s['steps']} steps, {s['parameters']} parameters",
           f"  held-out sampled accuracy {b['sampled_accuracy']:.3f} +- {b['sampled_accuracy_stderr']:.3f} -> "
           f"{a['sampled_accuracy']:.3f} +- {a['sampled_accuracy_stderr']:.3f}; greedy {b['greedy_accuracy']:.3f} "
           f"-> {a['greedy_accuracy']:.3f}",
           f"  {s['total_seconds']} s in all, the warm start (loaded or trained) {s['warm_start_seconds']} s"]
    rows = [json.loads(ln) for ln in (work / "train" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    times = [r["time"] for r in rows if isinstance(r.get("time"), (int, float))]
    if times:
        med = statistics.median(times)
        out.append(f"  one RL step: median {med:.3f} s (min {min(times):.3f}, max {max(times):.3f})")
        try:
            from minirl.config import PROFILES

            default = PROFILES[s["profile"]].rl_steps
            out.append(f"  the profile's default {default} steps: about {default * med:.0f} s of steps, "
                       f"plus evaluations")
        except (ImportError, KeyError):
            pass
    return out


def _real_sizes_lines(result: dict) -> list[str]:
    """bench --real-sizes' JSON: per batch, each stage's median seconds over the steps after the first, its largest
    measured peak and the plan's (GB)."""
    out = [f"  {result.get('parameters', 0) / 1e6:.0f} M parameters on {result.get('device', '?')}, "
           f"{result.get('settings', '')}"]
    for key, steps in result.get("batches", {}).items():
        later = steps[1:] or steps  # the first step warms up kernels and allocators
        for stage, planned in result["plan"][key].items():
            secs = statistics.median(s[stage][0] for s in later)
            peaks = [s[stage][1] for s in steps if s[stage][1] is not None]
            peak = f"{max(peaks):.2f}" if peaks else "-"
            out.append(f"  {key} {stage:16s} {secs:8.2f} s  peak {peak:>6} GB  planned {planned:.2f} GB")
    return out


def summary(work_dir: str) -> int:
    work = Path(work_dir)
    rows = [ln.split("\t") for ln in (work / "parts.tsv").read_text().splitlines() if ln.strip()]
    env = json.loads((work / "env.json").read_text()) if (work / "env.json").exists() else {}
    print("=" * 30 + " gpu_check summary " + "=" * 30)
    machine = ", ".join(f"{k} {v}" for k, v in env.items()) or "(unknown: the imports part did not pass)"
    print(f"machine: {machine}")
    print(f"{'part':12s} {'status':10s} {'seconds':>8s} {'limit':>6s}")
    for name, status, secs, limit in rows:
        print(f"{name:12s} {status:10s} {float(secs):8.1f} {float(limit):6.0f}")
    total = sum(float(r[2]) for r in rows)
    print(f"{'all parts':12s} {'':10s} {total:8.1f}")
    status = {r[0]: r[1] for r in rows}
    sections = [("bench", lambda: _bench_lines(json.loads((work / "bench.json").read_text()))),
                ("train", lambda: _train_lines(work)),
                ("real_sizes", lambda: _real_sizes_lines(json.loads((work / "real_sizes.json").read_text())))]
    for name, lines in sections:
        # real_sizes saves its result after each step: a part stopped at its limit still shows the steps it finished
        partial = name == "real_sizes" and status.get(name) == "TIMEOUT" and (work / "real_sizes.json").exists()
        if status.get(name) == "ok" or partial:
            print(f"{name}:" + (" (partial: the steps finished before its time limit)" if partial else ""))
            try:
                print("\n".join(lines()))
            except (OSError, KeyError, ValueError, TypeError) as e:  # the figures are reported, not guessed
                print(f"  (could not read its figures: {e!r})")
    for name in [r[0] for r in rows if r[0].startswith("nb")]:
        print(f"{name}: {status[name]}; pytest: {_pytest_line(work / f'{name}.log') or '(no closing line)'}")
    failed = [r[0] for r in rows if r[1] != "ok"]
    print(f"RESULT: {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'}: {len(rows) - len(failed)} of "
          f"{len(rows)} parts ok")
    print("=" * 79)
    return 1 if failed else 0


if __name__ == "__main__":
    commands = {"plan": plan, "verify": verify, "summary": summary}
    if len(sys.argv) != 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    sys.exit(commands[sys.argv[1]](sys.argv[2]))
