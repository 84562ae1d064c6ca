#!/usr/bin/env bash
# Issue 25's GPU targets in one device call (the plan, the preparation and what each line
# checks: benchmarks/gpu_backend.py's docstring, "GPU session plan"). From the repository root:
#
#   bash benchmarks/gpu_session.sh                  # GPU machine: cuda, full sizes, into $OUT
#   OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHON=.venv/bin/python \
#       bash benchmarks/gpu_session.sh --device cpu --smoke     # here: torch-CPU plumbing
#
# Options: --device DEV (cuda), --smoke (tiny sizes), --only a,b (these parts alone, e.g. a
# rerun of what a time limit cut), --budget-s S (wall seconds for all parts, 450: a run call's
# timeout_s of 480 leaves 30 s). Parts in order, most important first, each under its own cap
# (`timeout`), and each keeps back the least that the selected parts after it need (`needs`),
# so a slow part cuts itself, not the MNIST run. Each measurement's JSON line goes
# to $OUT/gpu.jsonl as soon as it is measured; the full log to $OUT/session.log, the result
# lines to stdout.
set -u
device=cuda smoke="" only="" budget=450
while [ $# -gt 0 ]; do
    case $1 in
        --device) device=$2; shift 2 ;;
        --smoke) smoke=--smoke; shift ;;
        --only) only=",$2,"; shift 2 ;;
        --budget-s) budget=$2; shift 2 ;;
        *) echo "usage: $0 [--device DEV] [--smoke] [--only a,b] [--budget-s S]" >&2; exit 2 ;;
    esac
done
out=${OUT:-outputs/gpu_session}
mkdir -p "$out"
jsonl=$out/gpu.jsonl log=$out/session.log
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
start=$(date +%s)
deadline=$((start + budget))
threads=""
[ "$device" = cpu ] && threads="--torch-threads 1"
compile=reduce-overhead  # CUDA graphs on top of inductor; off CUDA gpu_backend refuses it
[ "${device#cuda}" = "$device" ] && compile=default

# set-up (~20 s on the GPU machine): gpinfer, sep's plugin and svi's are not installed there;
# a copy of each with its entry points (how method="sep" is found), and the wheels of .gpu/whl
if ! $py -c "import gpinfer_ep, gpinfer_svi, array_api_compat" 2>/dev/null; then
    $py -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-compile \
        --target /tmp/site .gpu/whl/*.whl . plugins/gpinfer-ep plugins/gpinfer-svi || exit 1
    export PYTHONPATH=/tmp/site
fi
data=""
[ -f .gpu/data/mnist.npz ] && data="--data .gpu/data/mnist.npz"
{
    echo "### set-up done at $(($(date +%s) - start)) s; device $device, budget $budget s"
    $py -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__,
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
} 2>&1 | tee -a "$log"

# the parts, most important first: name, cap (s), the least it needs (s: kept back for it by
# the parts before it, when selected), gpu_backend.py arguments; expected on an H100 after it
names=(profile tri profile-compiled synthetic svi mnist)
caps=(75 30 110 130 40 120)
needs=(30 15 60 60 25 100)
argv=("profile --profile-methods sep,svi"                       # ~40 s
      "tri"                                                     # ~10 s
      "profile --profile-methods sep --compile $compile"        # ~60-90 s
      "synthetic --sizes 1e5,1e6 --cpu-batches 25"              # ~100 s
      "svi"                                                     # ~15 s
      "mnist --lr 1e-2 --budget-s 60 --eval-every-s 3 $data")   # ~90 s
selected() { [ -z "$only" ] || [ "${only#*,"$1",}" != "$only" ]; }

# the lines shown on stdout: results, MNIST evaluations, part timings, errors
results='^(==|   |  epoch|  sep|\[|torch |Traceback|[A-Za-z.]*(Error|Exception))'
summary=""
for i in "${!names[@]}"; do
    name=${names[$i]} cap=${caps[$i]}
    selected "$name" || continue
    reserve=0
    for j in "${!names[@]}"; do
        [ "$j" -gt "$i" ] && selected "${names[$j]}" && reserve=$((reserve + needs[j]))
    done
    t0=$(date +%s)
    left=$((deadline - t0 - reserve))
    [ "$left" -lt "$cap" ] && cap=$left
    if [ "$cap" -lt 15 ]; then
        echo "### $name: skipped, ${cap} s left of the budget" | tee -a "$log"
        summary="$summary\"$name\": \"skipped\", "
        continue
    fi
    echo "### $name: at most $cap s (session at $((t0 - start)) s)" | tee -a "$log"
    # shellcheck disable=SC2086  # the arguments split into words
    timeout -k 10 "$cap" $py benchmarks/gpu_backend.py ${argv[$i]} --device "$device" $smoke \
        $threads --out "$jsonl" 2>&1 | tee -a "$log" \
        | grep --line-buffered -E "$results"
    rc=${PIPESTATUS[0]} t=$(($(date +%s) - t0))
    echo "### $name: exit $rc after $t s$([ "$rc" = 124 ] && echo ' (its cap: cut)')" \
        | tee -a "$log"
    summary="$summary\"$name\": {\"exit\": $rc, \"wall_s\": $t}, "
done

echo "{\"part\": \"session\", \"time\": $(date +%s), \"device\": \"$device\", \"smoke\": \
$([ -n "$smoke" ] && echo true || echo false), \"budget_s\": $budget, ${summary}\"wall_s\": \
$(($(date +%s) - start))}" | tee -a "$jsonl"
