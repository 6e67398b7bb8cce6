#!/usr/bin/env python
"""How long a fresh process takes to its first generated token, part by part: a Colab learner's first wait.

    python scripts/cold_start.py                          # the course pair's shapes, on CUDA if present
    python scripts/cold_start.py --paths default,reduce-overhead,eager --json cold_start.json
    python scripts/cold_start.py --tiny --paths eager --cpus all   # a smoke test on any CPU (CI)

Each measurement is a new Python process (``--child``) that reports four parts:

- **import**: torch, transformers and specdec_edu;
- **build**: the target and the draft with random weights at the course pair's shapes (SmolLM2-1.7B, 24 × 2048,
  and SmolLM2-135M, 30 × 576; ``--tiny``: two toy models), built on the device in the course's dtype
  (``default_dtype``: bf16 where native, fp16 on older GPUs, fp32 on a CPU). Time depends on shapes, not weights;
  no download is timed (on Colab the 3.7 GB download comes on top);
- **compile**: making the compiled caches of both models (``torch.compile`` of every width, or the capture of
  CUDA graphs); 0 on the eager path;
- **first token**: after that, ``speculative_generate`` up to the end of its first round, which drafts γ = 4 and
  verifies them (the first new token is emitted there).

After the clock, each row also gives ``target_step_ms``: the target's one-token step on that path (the mean of 32,
target-only, on the caches the start made), so that a path's start and its speed are weighed in one run.

``total`` is the wall time from the parent starting the process to the child's first token (interpreter start
included). Every path runs **cold** (empty compile caches: ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``
point at a fresh temporary folder) and then **warm** (the same folder, now filled), with all CPUs and under
``taskset -c 0,1``: two CPUs, a proxy for Colab's 2 vCPUs (compiling is CPU work).

Paths (``--paths``): ``default`` (what ``speculative_generate`` does here: ``capture`` on CUDA, eager on a CPU),
``capture`` (``kv.CAPTURE``: each width's eager forward recorded with ``torch.cuda.graph``, no dynamo, no inductor;
CUDA only), ``reduce-overhead`` (inductor with CUDA graphs: the default on CUDA until 2026-12-04), ``inductor``
(compiled, inductor's default mode), ``cudagraphs`` (torch's ``cudagraphs`` backend: dynamo's trace replayed as
CUDA graphs, no code generation; CUDA only), ``eager``.
Goal on a GPU under two CPUs (issue 24): cold ≤ 90 s, warm ≤ 20 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = {"default": None, "inductor": {"backend": "inductor", "mode": "default"},
         "reduce-overhead": {"backend": "inductor", "mode": "reduce-overhead"}, "cudagraphs": {"backend": "cudagraphs"},
         "capture": {"backend": "capture"}, "eager": None}
PARTS = ("import", "build", "compile", "first_token")
GAMMA = 4  # the course's γ
STEPS = 32  # one-token target steps timed after the first token: their mean is the path's step


def child(args) -> dict:
    """Run in the fresh process: time the four parts, return them (seconds)."""
    spawned = float(os.environ["COLD_START_SPAWNED"])
    times, start = {}, time.perf_counter()
    import torch  # noqa: F401  (timed: the import is part of a cold start)
    import transformers  # noqa: F401

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check import SIZES, make_model  # the same shapes as the GPU check
    from specdec_edu import autoregressive_generate, kv, speculative_generate
    from specdec_edu.drafters import ModelDrafter
    from specdec_edu.generate import compiles_by_default
    from specdec_edu.models.devices import default_device, default_dtype, device_name

    times["import"], start = time.perf_counter() - start, time.perf_counter()
    device = torch.device(args.device) if args.device else default_device()
    dtype = default_dtype(device)
    spec = SIZES["tiny" if args.tiny else "smollm2"]
    target = make_model(spec["target"], spec["vocab"], device, dtype, seed=0, tied=spec["tied"])
    draft = make_model(spec["draft"], spec["vocab"], device, dtype, seed=1, tied=spec["tied"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    times["build"], start = time.perf_counter() - start, time.perf_counter()

    compiled = compiles_by_default(device) if args.path == "default" else args.path != "eager"
    options = PATHS[args.path]
    prompt = torch.randint(0, spec["vocab"], (1, args.prompt_length), generator=torch.Generator().manual_seed(0))
    positions = args.prompt_length + GAMMA + 1 + GAMMA  # prompt, the new tokens, γ drafts: what speculative_generate asks
    if compiled:  # the caches speculative_generate would make; the call below reuses them
        kv.shared_static_cache(target, positions, options)
        ModelDrafter(draft, max_cache_len=positions, compile=True, compile_options=options)
        sync()
    times["compile"], start = time.perf_counter() - start, time.perf_counter()

    # γ + 1 new tokens leave the first round its full γ = 4 drafts (max_new_tokens=1 would cut γ to 0: a target-only
    # step that never drafts). Random weights rarely accept, so later rounds follow; the first token is the end of
    # round 1: what ran before the generation's clock, the prefill, and round 1's phases (profile: device waited for).
    out = speculative_generate(target, draft, prompt.to(device), max_new_tokens=GAMMA + 1, gamma=GAMMA,
                               compile=compiled, compile_options=options, profile=True)
    sync()
    stats = out.stats
    now, now_wall = time.perf_counter(), time.time()
    before_clock = (now - start) - stats.seconds
    times["first_token"] = before_clock + stats.prefill_seconds + sum(s[0] for s in stats.phase_seconds.values())
    # up to the first token, as first_token: the rounds after the first one are not part of the start
    times["total"] = (now_wall - spawned) - ((now - start) - times["first_token"])

    # What the wait buys: the target's one-token step on this path, on the caches made above (after the clock of the
    # cold start). A path that starts fast but steps slowly is no default: the two are weighed together.
    timed = autoregressive_generate(target, prompt.to(device), max_new_tokens=STEPS + 1, compile=compiled,
                                    compile_options=options)
    sync()
    step_ms = 1000 * (timed.stats.seconds - timed.stats.prefill_seconds) / STEPS  # the prefill gives the first token
    # what "default" meant in this version (torch.compile's own default backend is inductor)
    resolved = {"backend": "inductor", **kv.full_compile_options(device, options)} if compiled else {}
    return {"path": args.path, "compiled": bool(out.stats.compiled), "backend": resolved.get("backend"),
            "mode": resolved.get("mode"), "device": str(device), "device_name": device_name(device),
            "torch": torch.__version__, "transformers": transformers.__version__, "dtype": str(dtype),
            "torch_threads": torch.get_num_threads(), "first_round_drafted": stats.drafted_per_round[0], "seconds": times,
            "target_step_ms": step_ms}


def run_child(args, path: str, cpus: str, cache_dir: str) -> dict:
    """One fresh process; ``cpus`` is "all" or a taskset list such as "0,1"."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, TRITON_CACHE_DIR=os.path.join(cache_dir, "triton"),
               COLD_START_SPAWNED=repr(time.time()))
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--path", path,
               "--prompt-length", str(args.prompt_length)] + (["--tiny"] if args.tiny else []) + \
              (["--device", args.device] if args.device else [])
    if cpus != "all":
        command = ["taskset", "-c", cpus] + command
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        return {"path": path, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def taskset_cpus(spec: str) -> set[int]:
    """The CPUs a taskset list names: "0,1" → {0, 1}, "0-3,8" → {0, 1, 2, 3, 8}."""
    cpus = set()
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def cpu_sets(requested: str) -> list[str]:
    """The CPU sets to measure: "all" and/or a taskset list such as "0,1". A list is skipped, with a note, where
    taskset is missing or where this process may not run on all its CPUs (a container given CPUs 4 and 5 refuses
    ``taskset -c 0,1``): the note names the CPUs it may use."""
    sets = [s.strip() for s in requested.split(";") if s.strip()]
    # the CPUs of specdec_edu.models.devices.usable_cores, read here: this parent imports no torch (its children's
    # imports are timed as part of a cold start, and importing torch here first would warm the disk cache for them)
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    usable = []
    for s in sets:
        if s != "all" and shutil.which("taskset") is None:
            print(f"skipped cpus {s}: needs taskset", file=sys.stderr)
            continue
        if s != "all" and not taskset_cpus(s) <= allowed:
            print(f"skipped cpus {s}: this process may run on CPUs {sorted(allowed)} only; pass --cpus 'all;A,B' "
                  "with two of them", file=sys.stderr)
            continue
        usable.append(s)
    return usable


def measure(args, save=lambda rows: None) -> list[dict]:
    """Every (path, CPU set) cold then warm; ``save(rows)`` after each row, so that a run cut by a time limit keeps
    what it measured."""
    rows = []
    for path in args.paths.split(","):
        if path not in PATHS:
            raise SystemExit(f"unknown path {path!r}: choose from {', '.join(PATHS)}")
    for path in args.paths.split(","):
        for cpus in cpu_sets(args.cpus):
            with tempfile.TemporaryDirectory(prefix="cold_start_") as cache_dir:  # fresh: cold, then warm in it
                for cache in ("cold", "warm"):
                    row = run_child(args, path, cpus, cache_dir)
                    rows.append({"cpus": cpus, "cache": cache, **row})
                    print(format_row(rows[-1]), flush=True)
                    save(rows)
    return rows


def format_row(row: dict) -> str:
    label = "all CPUs" if row["cpus"] == "all" else f"taskset -c {row['cpus']}"
    if len(row["cpus"].split(",")) == 2:
        label += " (proxy for Colab's 2 vCPUs)"
    head = f"{row['path']:10s} {row['cache']:4s} {label:45s}"
    if "error" in row:
        return f"{head} FAILED: {row['error']}"
    s = row["seconds"]
    step = f" · then {row['target_step_ms']:.2f} ms per target step" if "target_step_ms" in row else ""
    return head + " ".join(f"{part} {s[part]:6.1f} s" for part in (*PARTS, "total")) + step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", default="default", help=f"comma-separated, from {', '.join(PATHS)}")
    ap.add_argument("--cpus", default="all;0,1", help='";"-separated CPU sets: "all" and/or a taskset list')
    ap.add_argument("--tiny", action="store_true", help="toy shapes: a smoke test that runs on any CPU in seconds")
    ap.add_argument("--device", default=None, help="default: CUDA, else MPS, else CPU")
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per process")
    ap.add_argument("--json", default=None, help="write the rows (and versions, date) here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", default="default", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    import platform

    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = " ".join(["python scripts/cold_start.py", *(sys.argv[1:] if argv is None else argv)])

    def save(rows):
        if args.json:
            Path(args.json).write_text(json.dumps({"date": date, "command": command,
                                                   "python": platform.python_version(), "cpu_count": os.cpu_count(),
                                                   "rows": rows}, indent=1))

    save([])  # the date and command are on disk before the first (slow) process starts
    rows = measure(args, save)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
