"""What the compiled path costs before it runs: seconds to compile a model's static-cache widths, from a cold cache.

    python scripts/compile_cost.py --json assets/results/compile_cost_cpu.json   # the embedded pair, this device

``speculative_generate(..., compile=True)`` compiles every width of a model's static cache (``kv.WIDTHS``) when it
first makes that cache. This script times exactly that, for the pair's target and draft, with torch.compile's on-disk
cache pointed at an empty folder (removed afterwards), so that the figure is what a fresh machine (a new Colab
runtime) pays once per process. ``python -m specdec_edu bench --compile on`` measures what compiling buys afterwards.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package, from a checkout

from specdec_edu import ModelDrafter, kv, load_pair  # noqa: E402
from specdec_edu.commands.bench import _versions  # noqa: E402
from specdec_edu.course.experiments import timed  # noqa: E402
from specdec_edu.models.devices import device_name  # noqa: E402
from specdec_edu.models.embedded import PAIRS  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="embedded")
    parser.add_argument("--device", default=None)
    parser.add_argument("--json", metavar="FILE")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="inductor-cold-") as cold:
        # inductor reads the variable when it compiles (not at import), and nothing has compiled yet in this process
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold
        try:
            target, draft, _ = load_pair(args.pair, device=args.device)
            device = target.device
            out = {
                "pair": args.pair, "device": str(device), "threads": torch.get_num_threads(), "widths": list(kv.WIDTHS),
                "options": kv.full_compile_options(device, None),
                "target_seconds": timed(lambda: kv.shared_static_cache(target, 256), device)[1],
                "draft_seconds": timed(lambda: ModelDrafter(draft, max_cache_len=256, compile=True), device)[1],
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "machine": device_name("cpu"),
                "versions": _versions(), "command": " ".join(["python scripts/compile_cost.py", *argv]),
            }
        finally:
            if before is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    print(f"compiling widths {out['widths']} on {device} from a cold cache: target {out['target_seconds']:.0f} s, "
          f"draft {out['draft_seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
