#!/usr/bin/env bash
# GPU check: the CUDA paths of the reference engine on one GPU, at most 8 minutes.
#
#   bash benchmarks/gpu_check.sh              # run it (needs torch with CUDA and a visible GPU)
#   bash benchmarks/gpu_check.sh --dry-run    # print what it would run, run nothing
#   OUT=/tmp/gpu-check bash benchmarks/gpu_check.sh
#
# Steps (each under its own timeout; the timeouts add up to 480 s):
#   1. pytest -m gpu: the CUDA cases (tests/test_transformers_path.py's cuda device)      150 s
#   2. bench_batching on cuda, float32: batching throughput and B=1 token identity          90 s
#   3. bench_batching on cuda, bfloat16                                                       90 s
#   4. specbuild recipe on a CUDA reference deployment (smollm2-ngram with build.device
#      cuda): build, serve through tritonserver, specbuild verify, speed-up                  150 s
# Writes $OUT/summary.json: per step its command, exit status, seconds, and passed / failed /
# skipped. Without a CUDA device every step is skipped, the summary says so, and it exits 0.
# Run from the repository root with specbuild installed (pip install -e '.[all]').
set -uo pipefail

OUT=${OUT:-gpu-check-out}
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { sed -n '2,17p' "$0"; exit 0; }
PY=${PYTHON:-python3}
RECIPE="$OUT/smollm2-ngram-cuda.yaml"

STEPS=(
  "pytest-gpu|150|OMP_NUM_THREADS=1 $PY -m pytest -q -m gpu tests/test_transformers_path.py"
  "bench-batching-fp32|90|$PY benchmarks/bench_batching.py --device cuda --dtype float32 --prompts humaneval:8 --max-tokens 32 --batch-sizes 1 4 8 --rounds 1 --json $OUT/bench_batching_cuda_fp32.json"
  "bench-batching-bf16|90|$PY benchmarks/bench_batching.py --device cuda --dtype bfloat16 --prompts humaneval:8 --max-tokens 32 --batch-sizes 1 4 8 --rounds 1 --json $OUT/bench_batching_cuda_bf16.json"
  "verify-cuda-deployment|150|specbuild recipe $RECIPE -o $OUT/smollm2-ngram-cuda"
)

if [[ $DRY == 1 ]]; then
  echo "# would write $RECIPE: recipes/smollm2-ngram.yaml with build.device: cuda, verify.prompts humaneval:8, free ports"
  for step in "${STEPS[@]}"; do
    IFS='|' read -r name limit cmd <<< "$step"
    echo "[$name] timeout ${limit}s: $cmd"
  done
  echo "# then: $OUT/summary.json"
  exit 0
fi

mkdir -p "$OUT"
RESULTS="$OUT/results.tsv"
: > "$RESULTS"
if $PY -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  GPU=$($PY -c "import torch; print(torch.cuda.get_device_name(0))")
else
  GPU=""
fi

sed -e 's/^  device: cpu/  device: cuda/' -e 's/^  prompts: humaneval:20/  prompts: humaneval:8/' \
    -e 's/^  http_port: 8000/  http_port: 0/' -e 's/^  grpc_port: 8001/  grpc_port: 0/' -e 's/^  metrics_port: 8002/  metrics_port: 0/' \
    -e 's/^name: smollm2-ngram/name: smollm2-ngram-cuda/' recipes/smollm2-ngram.yaml > "$RECIPE"

for step in "${STEPS[@]}"; do
  IFS='|' read -r name limit cmd <<< "$step"
  if [[ -z "$GPU" ]]; then
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "skipped" "" "0" "$cmd" >> "$RESULTS"
    continue
  fi
  echo "[$name] $cmd"
  start=$(date +%s)
  timeout "$limit" bash -c "$cmd" > "$OUT/$name.log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  status=passed
  [[ $rc != 0 ]] && status=failed
  [[ $rc == 124 ]] && status="failed (timeout ${limit}s)"
  echo "[$name] $status in ${seconds}s (log: $OUT/$name.log)"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$seconds" "$cmd" >> "$RESULTS"
done

GPU="$GPU" $PY - "$RESULTS" "$OUT/summary.json" <<'EOF'
import json, os, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
steps = [{"step": n, "status": s, "exit_status": int(rc) if rc else None, "seconds": int(t), "command": c} for n, s, rc, t, c in rows]
gpu = os.environ.get("GPU") or None
summary = {"gpu": gpu, "skipped": gpu is None, "reason": None if gpu else "no CUDA device (torch.cuda.is_available() is False)",
           "passed": all(s["status"] in ("passed", "skipped") for s in steps), "steps": steps}
for name in ("bench_batching_cuda_fp32.json", "bench_batching_cuda_bf16.json"):
    path = os.path.join(os.path.dirname(sys.argv[2]), name)
    if os.path.exists(path):
        summary[name.removesuffix(".json")] = [{k: r[k] for k in ("config", "tokens_per_s", "same_as_batch_1")} for r in json.load(open(path))["rows"]]
json.dump(summary, open(sys.argv[2], "w"), indent=2)
print(f"wrote {sys.argv[2]}: " + ("skipped, " + summary["reason"] if gpu is None else ("passed" if summary["passed"] else "FAILED")))
sys.exit(0 if summary["passed"] else 1)
EOF
