"""Ready time of a big pinned host buffer: populate + chunked cudaHostRegister vs cudaHostAlloc.

For GPU machines (and, with ``--cudart`` and the fake runtime, for the CPU
model of the overlap).  Each trial of each variant runs in a fresh child
process (no CUDA context, host-allocator cache or resident memory carries
over from one to the next), the variants interleaved (the order rotates per
trial); the figure is the median of ``--trials``.  Inside the child CUDA is
initialised first, untimed, and the timer covers only the allocation, until
the buffer is resident and pinned (checked, untimed).  Variants:

* ``kvpool cuda-register`` -- ``allocate_host(size, pin="cuda-register")``
  in the chunks a pool of that size registers in
  (:func:`~kvpool.pool.backing.pool_register_chunk`: about a sixteenth):
  libpinmem's threads populate chunk i+1 while chunk i is registered;
* ``kvpool register sequential`` -- the same with the libpinmem option
  ``register_overlap`` off: populate everything, then register;
* ``cudaHostAlloc`` -- ``allocate_host(size, pin="cuda-alloc")``: one
  ``cudaHostAlloc`` call, as a CUDA program would make it;
* ``torch pin_memory`` -- ``torch.empty(size, dtype=uint8, pin_memory=True)``;
* ``kvpool mlock`` -- ``allocate_host(size, pin="mlock")``: the same
  populate without CUDA, for scale (it runs without a GPU).

The figure that matters is cuda-register / cudaHostAlloc (goal: >= 6x,
>= 15 GB/s for 64 GiB on an H200).  The report also states from which size
``pin="auto"`` takes the register path (the libpinmem option
``register_threshold``, ``KVPOOL_REGISTER_THRESHOLD_BYTES``) and why.
Without a CUDA device it says so and exits with status 2.  Each trial needs
``size`` bytes of free memory; a size above MemAvailable minus 4 GiB is
refused before anything runs.

``--cudart PATH`` loads that CUDA runtime in the children (``KVPOOL_CUDART``)
and skips torch's CUDA: with libpinmem's fake runtime and
``KVPOOL_FAKE_CUDA_REGISTER_MS_PER_GIB`` (a registration rate) it measures
the overlap of population and registration on a CPU machine.

    python -m kvpool.cli.bench.pinned_ready [--size 64G] [--trials 3] [--json] [--only NAMES]
        [--cudart PATH]
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
    "kvpool register sequential": "cuda-register",
    "cudaHostAlloc": "cuda-alloc",
    "torch pin_memory": None,
    "kvpool mlock": "mlock",
}
#: Variants that need torch's CUDA (not libpinmem's runtime alone).
_TORCH_CUDA = ("torch pin_memory",)
#: Why ``pin="auto"`` registers from ``register_threshold`` (the report says it).
THRESHOLD_WHY = (
    "measured on an H200 (driver 580, 16 cores, median of 3): populate + cudaHostRegister "
    "was 2.60x faster than cudaHostAlloc at 1 GiB, 2.81x at 4 GiB, 3.13x at 16 GiB, 4.62x "
    "at 64 GiB; nothing below 1 GiB was measured, so cudaHostAlloc stays there"
)
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
    if pin != "mlock" and not os.environ.get("KVPOOL_CUDART"):
        torch.cuda.init()  # torch's libcudart first, so libpinmem uses the same one
        torch.zeros(1, device="cuda")  # the context exists before the timer starts
    from kvpool.native import calls
    from kvpool.native.buffer import allocate_host
    from kvpool.pool.backing import pool_register_chunk

    chunk = None
    if pin == "cuda-register":
        chunk = pool_register_chunk(size, 0)
        calls.option_set("register_overlap", 0 if "sequential" in variant else 1)

    if pin is None:
        start = time.perf_counter()
        t = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        seconds = time.perf_counter() - start
        if not t.is_pinned():
            raise RuntimeError("torch.empty(pin_memory=True) returned memory that is not pinned")
        return {"seconds": seconds, "pinned": "torch (cudaHostAlloc)"}
    start = time.perf_counter()
    buf = allocate_host(size, pin=pin, register_chunk=chunk)
    seconds = time.perf_counter() - start
    try:
        if buf.pinned in ("none", ""):
            raise RuntimeError(f"allocate_host(pin={pin!r}) returned unpinned memory")
        how = f"{buf.pinned}, {buf.threads_used} thread(s), {buf.register_chunks} chunk(s)"
        return {"seconds": seconds, "pinned": how}
    finally:
        buf.close()


def run_trials(
    variants: list[str], size: int, trials: int, cudart: str | None = None
) -> dict[str, Any]:
    """Run ``trials`` rounds of every variant, each in a child process, interleaved.

    A variant whose child fails (the machine refused it, say) is reported
    under ``"failed"`` with the end of its error, and not run again.
    ``cudart``: the CUDA runtime the children load (``KVPOOL_CUDART``); this
    process's own environment is left as it is.

    Returns:
        ``{"size", "trials", "variants": {name: {"seconds": [...],
        "GBps_median", "pinned"}}, "failed": {name: message}}``.
    """
    samples: dict[str, list[float]] = {v: [] for v in variants}
    pinned: dict[str, str] = {}
    failed: dict[str, str] = {}
    env = None if cudart is None else dict(os.environ, KVPOOL_CUDART=cudart)
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
                    env=env,
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


def _runtime_missing(path: str) -> str | None:
    """Why the CUDA runtime at ``path`` cannot pin here, or None (asked in a child)."""
    code = "from kvpool.native.machine import capabilities as c; print(c().cuda_error or '')"
    env = dict(os.environ, KVPOOL_CUDART=path)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        return " | ".join(done.stderr.strip().splitlines()[-2:])
    return done.stdout.strip() or None


def threshold_report(threshold: int) -> str:
    """What ``pin="auto"`` does at each size, and why."""
    return (
        f"pin='auto' registers from {threshold / 2**30:.3g} GiB ({threshold} bytes, "
        f"register_threshold) and calls cudaHostAlloc below: {THRESHOLD_WHY}"
    )


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
    p.add_argument(
        "--cudart",
        metavar="PATH",
        help="the CUDA runtime the children load (KVPOOL_CUDART), e.g. libpinmem's fake one; "
        "torch's CUDA is not used then",
    )
    p.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.size)))
        return 0
    # Only the children load it: in this process KVPOOL_CUDART would stay
    # set, and libpinmem would load it here too (a caller's CUDA, e.g. tests').
    cudart = os.path.abspath(args.cudart) if args.cudart else None
    if args.trials < 1:
        p.error("--trials must be >= 1")
    chosen = list(VARIANTS) if args.only is None else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in chosen if n not in VARIANTS]
    if unknown or not chosen:
        p.error(f"--only: unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    if cudart is not None:
        torch_cuda = [n for n in chosen if n in _TORCH_CUDA]
        if torch_cuda:
            p.error(f"--cudart: {torch_cuda} need torch's CUDA; leave them out (--only)")
        missing = _runtime_missing(cudart)
    else:
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
    result = run_trials(chosen, args.size, args.trials, cudart)
    got = result["variants"]
    base = got.get("cudaHostAlloc", {}).get("GBps_median")
    reg = got.get("kvpool cuda-register", {}).get("GBps_median")
    seq = got.get("kvpool register sequential", {}).get("GBps_median")
    result["register_over_cudaHostAlloc"] = reg / base if reg and base else None
    result["overlapped_over_sequential"] = reg / seq if reg and seq else None
    result["cpus"] = os.cpu_count()
    result["register_threshold"] = _register_threshold()
    result["register_threshold_why"] = THRESHOLD_WHY
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
        overlap = result["overlapped_over_sequential"]
        if overlap is not None:
            print(f"overlapped / sequential population and registration: {overlap:.2f}x")
        print(threshold_report(result["register_threshold"]))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
