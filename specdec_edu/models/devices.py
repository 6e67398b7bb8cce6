"""Where the course runs: the best device here, the dtype it computes in, and whether "here" is Google Colab."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import torch

__all__ = ["DTYPES", "default_device", "default_dtype", "device_name", "dtype_reason", "float64_device", "memory_gib",
           "native_bf16", "on_colab", "thread_share", "usable_cores"]

#: The names ``$SPECDEC_EDU_DTYPE`` accepts, and the dtypes they mean.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def default_device() -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def float64_device() -> torch.device:
    """The best device that computes in float64: :func:`default_device`, except Apple's MPS, which has no float64
    (``.double()`` raises there), where it is the CPU. The exactness lessons (notebooks 03–05) compute p and q in
    float64 from the embedded pair, which the CPU runs in seconds."""
    device = default_device()
    return torch.device("cpu") if device.type == "mps" else device


def requested_device(name: str | None) -> torch.device:
    """The device a command's ``--device`` names (``None``: :func:`default_device`), or a ``ValueError`` naming the
    fix when torch cannot use it here (torch's own message is an AssertionError from deep inside the first load)."""
    if name is None:
        return default_device()
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r}: not a device torch knows; use cuda, mps or cpu") from None
    if device.type not in ("cuda", "mps", "cpu"):  # xpu, meta, …: torch knows them, the course does not run there
        raise ValueError(f"--device {name}: the course runs on cuda, mps or cpu; leave --device out (the best "
                         f"available: {default_device()}) or pass one of those")
    mps = getattr(torch.backends, "mps", None)
    usable = {"cuda": torch.cuda.is_available(), "mps": mps is not None and mps.is_available()}.get(device.type, True)
    if not usable:
        raise ValueError(f"--device {name}: torch {torch.__version__} sees no {device.type.upper()} device here; "
                         f"leave --device out (the best available: {default_device()}) or pass --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), numbered "
                         f"from 0; pass --device cuda (the first) or cuda:N below {torch.cuda.device_count()}")
    return device


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity mask (what ``taskset -c 0,1`` or a container's CPU set leaves),
    not ``os.cpu_count()``, which counts every CPU of the machine."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def memory_gib() -> float | None:
    """The machine's memory in GiB, or ``None`` where the system does not say (not POSIX)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (AttributeError, ValueError, OSError):
        return None


def thread_share(workers: int, cores: int | None = None) -> int:
    """The threads each of ``workers`` processes gets when they run side by side on ``cores`` (default: the usable
    ones): its share, at least one. More threads than cores in all make OpenMP's threads wait for each other by
    spinning, and everything slows down (the test suite's workers and ``scripts/execute_notebooks.py --jobs`` use it).
    """
    return max(1, (usable_cores() if cores is None else cores) // workers)


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name ("AMD EPYC 7B13", "Apple M2"), or the architecture ("x86_64") where the system does not
    say: Linux's ``/proc/cpuinfo``, macOS's ``sysctl``, else ``platform`` (which on Linux gives only the
    architecture)."""
    try:
        with open(cpuinfo) as info:
            for line in info:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device) -> str:
    """What a measurement ran on, in words, so that a recorded time names its machine: the GPU's name ("NVIDIA
    H200"), or the CPU's model and the cores this process may use ("AMD EPYC, 2 cores"). Not ``platform``'s
    "x86_64", which does not tell a 2-core AMD EPYC from a 2-core Intel Xeon, though the course's notebooks ran 1.6×
    slower on the first."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple GPU (MPS) of {cpu_model()}"
    cores = usable_cores()
    return f"{cpu_model()}, {cores} core{'s' if cores != 1 else ''}"


def native_bf16(device) -> bool:
    """Does this CUDA device compute bf16 in hardware (compute capability ≥ 8.0: A100, L4, H100, …)?

    Not ``torch.cuda.is_bf16_supported()``: that answers True on a T4 (7.5), where bf16 is *emulated*, and
    emulated bf16 matrix products run slower than fp32 (and Triton has failed to compile bf16 below sm_80).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def default_dtype(device, reduced: bool = True) -> torch.dtype:
    """The dtype a model pair computes in on ``device``: one rule for the whole course.

    ``$SPECDEC_EDU_DTYPE`` (``fp32``, ``fp16`` or ``bf16``) decides when set. Otherwise, with ``reduced``
    (hub pairs): bf16 on a CUDA device that has it natively (compute capability ≥ 8.0), fp16 on older CUDA
    devices (T4, V100), fp32 on the CPU and MPS. Half the bytes of fp32 halve a GPU step's weight reads.
    ``reduced=False`` (the embedded pair, whose lessons need exact fp32 arithmetic): fp32 everywhere.
    """
    chosen = requested_dtype_name()
    if chosen:
        return DTYPES[chosen]
    device = torch.device(device)
    if not reduced or device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if native_bf16(device) else torch.float16


def on_colab() -> bool:
    """True inside a Google Colab runtime: in its notebook kernel (which has imported ``google.colab``) and in a
    command a cell starts (``!python -m specdec_edu gpu-report``: a fresh interpreter, which has not imported it, but
    inherits the runtime's ``COLAB_RELEASE_TAG``). Kaggle's image, built on Colab's, sets that variable too: there a
    GPU session gets the hub pair as well."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def requested_dtype_name() -> str:
    """``$SPECDEC_EDU_DTYPE`` as a key of :data:`DTYPES`, or "" when unset or blank; any other value is refused, with
    the values it takes."""
    chosen = os.environ.get("SPECDEC_EDU_DTYPE", "").strip().lower()
    if chosen and chosen not in DTYPES:
        raise ValueError(f"SPECDEC_EDU_DTYPE={chosen!r} is not a dtype: set it to one of {sorted(DTYPES)}, "
                         "or unset it for the device's default.")
    return chosen


def dtype_reason(device, dtype: torch.dtype) -> str:
    """One line saying which dtype a pair computes in on ``device``, and why (for a notebook's setup cell)."""
    device, name = torch.device(device), {v: k for k, v in DTYPES.items()}.get(dtype, str(dtype))
    chosen = requested_dtype_name()  # a value it does not take is refused here too, not echoed as if it were one
    if chosen:  # the override decides, unless the code loaded this pair in another dtype on purpose (notebook 05)
        if DTYPES.get(chosen) == dtype:
            return f"{name} (set by SPECDEC_EDU_DTYPE)"
        overflow = ", or fp16 overflowed and the pair was loaded again (a warning says)" if (
            chosen == "fp16" and dtype == torch.float32) else ""
        return f"{name} (chosen here, over SPECDEC_EDU_DTYPE={chosen}: the code loaded it so{overflow})"
    if device.type != "cuda":
        where = "off a GPU" if device.type == "cpu" else "off CUDA"  # MPS is Apple's GPU: fp32 there too
        return (f"{name} (on {device.type}: the course's default {where}: "
                "its rounding stays far below anything that could flip a token)")
    major, minor = torch.cuda.get_device_capability(device)
    if dtype == torch.float32:  # the embedded pair always; a hub pair after its 16-bit forward overflowed (a warning says)
        return f"{name} (full precision: the embedded pair's on every device, and a hub pair's after a 16-bit overflow)"
    gpu = f"this GPU, compute capability {major}.{minor},"
    if dtype == torch.bfloat16:
        why = f"{gpu} has bf16 in hardware" if major >= 8 else \
            f"{gpu} has no native bf16: emulated, slower than fp16 (SPECDEC_EDU_DTYPE=fp16)"
    else:
        why = f"{gpu} has no native bf16 (it would be emulated, slower), so fp16" if major < 8 else \
            f"{gpu} has bf16 in hardware, but fp16 was chosen"
    return f"{name} ({why}; SPECDEC_EDU_DTYPE=fp32 for exact arithmetic)"
