#!/usr/bin/env bash
# The wheels that `scripts/gpu_course_checks.sh notebooks` needs on the lent GPU machine, fetched here into .whl/.
#
#   bash scripts/gpu_wheels.sh                          # for the GPU image's Python (3.12), into .whl/
#   PY=3.11 WHEELS=/tmp/whl bash scripts/gpu_wheels.sh  # for this machine's Python: the CPU rehearsal (below)
#
# Why: that machine cannot reach a registry, and its image (see /work/.library/device/KINDS.md) has torch,
# transformers, numpy, scipy, matplotlib and tqdm but no Jupyter stack: no nbclient, nbformat, ipykernel, IPython
# or ipywidgets. gpu_course_checks.sh installs whatever is in .whl/ (with --no-deps, into /tmp/site) before it
# runs; the device tool's call must name .whl in `carry` (git ignores it).
#
# What is left out, and why:
#   - packages the image already has (attrs, packaging, psutil, pygments, python-dateutil, typing-extensions);
#   - widgetsnbextension and jupyterlab_widgets: the front end's half of the widgets, never imported by a kernel;
#   - debugpy, jedi and parso (10 MB): ipykernel runs without a debugger and IPython without jedi's completion.
# The versions are pinned by constraints/gpu_wheels.txt: a new release cannot change what runs there unannounced.
# The working tree (tracked files and untracked ones git does not ignore) travels with these wheels and must stay under
# 64 MiB: the script prints the total. Last it prints GIT_COMMIT=<sha> for gpu_course_checks.sh's provenance (.git
# does not travel), and a warning when the tree that travels is not that commit (`git status --porcelain`); .whl/TREE
# and .whl/MANIFEST (every file's sha256) let the stages name the files that changed after it ran.
#
# The CPU rehearsal of that stage, in a venv that holds only what the image holds:
#   python3 -m venv /tmp/gpulike && /tmp/gpulike/bin/pip install torch==2.13.0 transformers==5.17.0 numpy scipy \
#     matplotlib tqdm safetensors accelerate psutil pygments attrs python-dateutil packaging typing-extensions pytest
#   PY=3.11 WHEELS=/tmp/whl bash scripts/gpu_wheels.sh
#   /tmp/gpulike/bin/pip install --no-index --no-deps --target /tmp/site /tmp/whl/*.whl
#   PYTHONPATH=/tmp/site SPECDEC_EDU_RANDOM_TARGET=1 /tmp/gpulike/bin/python scripts/execute_notebooks.py --scratch --quick
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-3.12}"
WHEELS="${WHEELS:-.whl}"
# .whl/ is what travels, and gpu_course_checks.sh installs it, however WHEELS names it (./.whl, its absolute path)
if [[ "$(realpath -m -- "$WHEELS")" == "$(realpath -m .whl)" && "$PY" != "3.12" ]]; then
  echo "PY=$PY: .whl/ travels to the GPU machine, whose Python is 3.12; for a rehearsal give WHEELS=/tmp/whl" >&2
  exit 2
fi
PACKAGES=(nbclient nbformat ipykernel ipywidgets)
ON_THE_IMAGE=(attrs packaging psutil pygments python_dateutil typing_extensions tzdata)
NOT_NEEDED=(widgetsnbextension jupyterlab_widgets debugpy jedi parso)

mkdir -p "$WHEELS"
rm -f "$WHEELS"/*.whl  # one version of each package: wheels for another Python left here would clash in the install
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --only-binary=:all: --python-version "$PY" --implementation cp "${platforms[@]}" \
  -c constraints/gpu_wheels.txt -d "$WHEELS" "${PACKAGES[@]}"  # the versions the notebooks ran under (see that file)
for name in "${ON_THE_IMAGE[@]}" "${NOT_NEEDED[@]}"; do
  rm -f "$WHEELS/$name"-*.whl
done
bytes() { xargs -0 -r stat -c %s -- 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }  # (a deleted file: none)
echo "$(ls "$WHEELS"/*.whl | wc -l) wheels in $WHEELS: $(printf '%s\0' "$WHEELS"/*.whl | bytes) bytes;" \
  "the tree that travels (tracked, and untracked but not ignored):" \
  "$(git ls-files -z --cached --others --exclude-standard | bytes) bytes (both together must stay under 67108864)"
# The commit that names the run: the working tree travels, .git does not, so GIT_COMMIT=<sha> is true only of a
# clean tree (tracked edits and untracked files that are not ignored travel too)
sha="$(git rev-parse HEAD)"
echo "GIT_COMMIT=$sha"
dirty="$(git status --porcelain)"
{  # travels in .whl/ and goes into every stage's provenance.txt: what ran, whatever GIT_COMMIT the call names
  echo "commit $sha"
  if [[ -n "$dirty" ]]; then
    echo "NOT CLEAN: $(wc -l <<<"$dirty") path(s) differ from it; git diff HEAD sha256 $(git diff HEAD | sha256sum | cut -c1-16)"
    head -n 20 <<<"$dirty"
  else
    echo "clean: the tree is that commit"
  fi
} > "$WHEELS/TREE"
# Every file's hash as it is now: the tree travels at the call, not now, and gpu_course_checks.sh checks it against
# this list, so an edit made between here and the call is named in the provenance (a file added since is not)
git ls-files -z --cached --others --exclude-standard | xargs -0 -r sha256sum -- > "$WHEELS/MANIFEST" 2>/dev/null || true
if [[ -n "$dirty" ]]; then
  {
    echo "WARNING: the working tree is not commit $sha: $(wc -l <<<"$dirty") path(s) differ (git status --porcelain):"
    head -n 20 <<<"$dirty"
    echo "WARNING: GIT_COMMIT=$sha would name code that did not run: commit first, then run this script again"
  } >&2
fi
