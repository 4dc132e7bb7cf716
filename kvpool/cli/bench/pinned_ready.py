"""Ready time of a big pinned host buffer: populate + chunked cudaHostRegister vs cudaHostAlloc.

For GPU machines.  Each trial of each variant runs in a fresh child process
(no CUDA context, host-allocator cache or resident memory carries over from
one to the next), the variants interleaved (the order rotates per trial);
the figure is the median of ``--trials``.  Inside the child CUDA is
initialised first, untimed, and the timer covers only the allocation, until
the buffer is resident and pinned (checked, untimed).  Variants:

* ``kvpool cuda-register`` -- ``allocate_host(size, pin="cuda-register")``:
  populated by libpinmem's threads, then ``cudaHostRegister`` in chunks;
* ``cudaHostAlloc`` -- ``allocate_host(size, pin="cuda-alloc")``: one
  ``cudaHostAlloc`` call, as a CUDA program would make it;
* ``torch pin_memory`` -- ``torch.empty(size, dtype=uint8, pin_memory=True)``;
* ``kvpool mlock`` -- ``allocate_host(size, pin="mlock")``: the same
  populate without CUDA, for scale (this is the one variant that runs
  without a GPU).

The figure that matters is cuda-register / cudaHostAlloc (target: >= 3x for
64 GiB).  ``pin="auto"`` registers at or above the libpinmem option
``register_threshold`` (``KVPOOL_REGISTER_THRESHOLD_BYTES``) and calls
cudaHostAlloc below it; the report shows the threshold, which these figures
should set.  Without a CUDA device it says so and exits with status 2.  Each
trial needs ``size`` bytes of free memory; a size above MemAvailable minus 4
GiB is refused before anything runs.

    python -m kvpool.cli.bench.pinned_ready [--size 64G] [--trials 3] [--json] [--only NAMES]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from kvpool.cli.args import size_arg
from kvpool.cli.bench.pool_ready import mem_available

__all__ = ["VARIANTS", "main", "run_trials"]

#: Variant name -> the ``pin`` argument of ``allocate_host`` (None: torch's pinned memory).
VARIANTS: dict[str, str | None] = {
    "kvpool cuda-register": "cuda-register",
    "cudaHostAlloc": "cuda-alloc",
    "torch pin_memory": None,
    "kvpool mlock": "mlock",
}
#: Memory left to the rest of the machine while a trial holds its buffer.
_HEADROOM = 4 << 30
#: Seconds one child may run (64 GiB through cudaHostAlloc takes tens of seconds).
_CHILD_TIMEOUT_S = 300
#: The module the children run (not ``__name__``: that is "__main__" under ``-m``).
_MODULE = "kvpool.cli.bench.pinned_ready"


def _child(variant: str, size: int) -> dict[str, Any]:
    """One trial, in this (fresh) process: seconds to a resident, pinned buffer."""
    import torch

    pin = VARIANTS[variant]
    if pin != "mlock":
        torch.cuda.init()  # torch's libcudart first, so libpinmem uses the same one
        torch.zeros(1, device="cuda")  # the context exists before the timer starts
    from kvpool.native.buffer import allocate_host

    if pin is None:
        start = time.perf_counter()
        t = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        seconds = time.perf_counter() - start
        if not t.is_pinned():
            raise RuntimeError("torch.empty(pin_memory=True) returned memory that is not pinned")
        return {"seconds": seconds, "pinned": "torch (cudaHostAlloc)"}
    start = time.perf_counter()
    buf = allocate_host(size, pin=pin)
    seconds = time.perf_counter() - start
    try:
        if buf.pinned in ("none", ""):
            raise RuntimeError(f"allocate_host(pin={pin!r}) returned unpinned memory")
        how = f"{buf.pinned}, {buf.threads_used} thread(s), {buf.register_chunks} chunk(s)"
        return {"seconds": seconds, "pinned": how}
    finally:
        buf.close()


def run_trials(variants: list[str], size: int, trials: int) -> dict[str, Any]:
    """Run ``trials`` rounds of every variant, each in a child process, interleaved.

    A variant whose child fails (the machine refused it, say) is reported
    under ``"failed"`` with the end of its error, and not run again.

    Returns:
        ``{"size", "trials", "variants": {name: {"seconds": [...],
        "GBps_median", "pinned"}}, "failed": {name: message}}``.
    """
    samples: dict[str, list[float]] = {v: [] for v in variants}
    pinned: dict[str, str] = {}
    failed: dict[str, str] = {}
    for trial in range(trials):
        order = variants[trial % len(variants) :] + variants[: trial % len(variants)]
        for variant in order:
            if variant in failed:
                continue
            try:
                run = subprocess.run(
                    [sys.executable, "-m", _MODULE, "--child", variant, "--size", str(size)],
                    capture_output=True,
                    text=True,
                    timeout=_CHILD_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                failed[variant] = f"a trial ran for more than {_CHILD_TIMEOUT_S} s"
                continue
            if run.returncode != 0:
                tail = " | ".join(run.stderr.strip().splitlines()[-3:])
                failed[variant] = f"status {run.returncode}: {tail}"
                print(f"  trial {trial + 1} {variant:22s} failed: {tail}", file=sys.stderr)
                continue
            got = json.loads(run.stdout.strip().splitlines()[-1])
            samples[variant].append(got["seconds"])
            pinned[variant] = got["pinned"]
            print(
                f"  trial {trial + 1} {variant:22s} {size / got['seconds'] / 1e9:7.2f} GB/s",
                file=sys.stderr,
                flush=True,
            )
    return {
        "size": size,
        "trials": trials,
        "variants": {
            v: {
                "seconds": s,
                "GBps_median": size / statistics.median(s) / 1e9,
                "pinned": pinned[v],
            }
            for v, s in samples.items()
            if s
        },
        "failed": failed,
    }


def _register_threshold() -> int:
    from kvpool.native import calls

    return calls.option_get("register_threshold")


def _cuda_missing() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit status.

    0: every variant ran; 1: a variant failed (reported, the others ran);
    2: no CUDA device, too little memory or a usage error.
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=size_arg, default=64 << 30, help="bytes (default 64G)")
    p.add_argument("--trials", type=int, default=3, help="interleaved trials (median of)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--only",
        metavar="NAME[,NAME]",
        help=f"run only these variants (of: {', '.join(VARIANTS)}); only 'kvpool mlock' "
        "runs without a GPU",
    )
    p.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.size)))
        return 0
    if args.trials < 1:
        p.error("--trials must be >= 1")
    chosen = list(VARIANTS) if args.only is None else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in chosen if n not in VARIANTS]
    if unknown or not chosen:
        p.error(f"--only: unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    missing = _cuda_missing() if any(VARIANTS[n] != "mlock" for n in chosen) else None
    if missing is not None:
        print(f"pinned_ready: {missing}", file=sys.stderr)
        return 2
    available = mem_available()
    if available is not None and args.size > available - _HEADROOM:
        print(
            f"pinned_ready: --size {args.size} does not fit: MemAvailable is {available} bytes "
            f"and {_HEADROOM} are left to the machine; pass a smaller --size",
            file=sys.stderr,
        )
        return 2
    result = run_trials(chosen, args.size, args.trials)
    got = result["variants"]
    base = got.get("cudaHostAlloc", {}).get("GBps_median")
    reg = got.get("kvpool cuda-register", {}).get("GBps_median")
    result["register_over_cudaHostAlloc"] = reg / base if reg and base else None
    result["cpus"] = os.cpu_count()
    result["register_threshold"] = _register_threshold()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.size / 2**30:.3g} GiB made resident and pinned, median of {args.trials}")
        for name, v in got.items():
            versus = f"{v['GBps_median'] / base:5.2f}x" if base else "  n/a"
            print(f"  {name:22s} {v['GBps_median']:7.2f} GB/s  {versus}  (pinned: {v['pinned']})")
        for name, why in result["failed"].items():
            print(f"  {name:22s} failed: {why}")
        ratio = result["register_over_cudaHostAlloc"]
        if ratio is not None:
            print(f"cuda-register / cudaHostAlloc: {ratio:.2f}x")
        print(
            f"pin='auto' registers from {result['register_threshold']} bytes (register_threshold)"
        )
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
