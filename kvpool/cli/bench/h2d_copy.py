#!/usr/bin/env python3
"""Host-to-device and device-to-host copy speed: libpinmem vs torch pinned memory.

Copies the same number of bytes between the GPU and three host buffers,
interleaved, best of N:

* ``kvpool``    - ``allocate_host(size, pin="auto")`` (cudaHostAlloc below
  1 GiB, else populate + cudaHostRegister, in one registration: a copy
  may not span two, so a size above the ``register_chunk`` option is
  refused);
* ``torch``     - ``torch.empty(size, pin_memory=True)``;
* ``pageable``  - ``torch.empty(size)`` (for scale).

The figure that matters is kvpool / torch (target: >= 0.95).  Needs a CUDA
device; without one it says so and exits with status 2.

    python -m kvpool.cli.bench.h2d_copy --size 1G --trials 10 [--hugepages auto] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from kvpool.cli.args import size_arg


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=size_arg, default=1 << 30, help="bytes per copy (default 1G)")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--hugepages", default="never", choices=["never", "auto", "required"])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("h2d_copy: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    torch.cuda.init()  # load torch's libcudart first, so libpinmem uses the same one
    from kvpool.native.buffer import allocate_host

    size = args.size
    device = torch.empty(size, dtype=torch.uint8, device="cuda")
    kv_buf = allocate_host(size, pin="auto", hugepages=args.hugepages, register_chunk=size)
    if len(kv_buf.registrations()) > 1:
        print(
            f"h2d_copy: {size} bytes are registered in {len(kv_buf.registrations())} chunks "
            "and one copy may not span two; ask for at most the register_chunk option",
            file=sys.stderr,
        )
        kv_buf.close()
        return 2
    hosts = {
        "kvpool": kv_buf.tensor(),
        "torch": torch.empty(size, dtype=torch.uint8, pin_memory=True),
        "pageable": torch.empty(size, dtype=torch.uint8),
    }
    for t in hosts.values():
        t.fill_(1)
    times: dict[str, dict[str, list[float]]] = {k: {"h2d": [], "d2h": []} for k in hosts}
    for trial in range(args.trials):
        names = list(hosts)
        names = names[trial % len(names) :] + names[: trial % len(names)]  # rotate the order
        for name in names:
            host = hosts[name]
            for direction in ("h2d", "d2h"):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if direction == "h2d":
                    device.copy_(host, non_blocking=True)
                else:
                    host.copy_(device, non_blocking=True)
                torch.cuda.synchronize()
                times[name][direction].append(time.perf_counter() - t0)
    result = {
        "size": size,
        "kvpool_pinned": kv_buf.pinned,
        "kvpool_hugepages": kv_buf.hugepages,
        "GBps": {
            name: {d: _gbps(size, min(ts)) for d, ts in by_dir.items()}
            for name, by_dir in times.items()
        },
    }
    for d in ("h2d", "d2h"):
        result[f"kvpool_over_torch_{d}"] = result["GBps"]["kvpool"][d] / result["GBps"]["torch"][d]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{size / (1 << 30):.2f} GiB per copy, best of {args.trials}; kvpool pinned="
            f"{kv_buf.pinned}, hugepages={kv_buf.hugepages}"
        )
        print(f"{'':10s} {'H2D GB/s':>10s} {'D2H GB/s':>10s}")
        for name, by_dir in result["GBps"].items():
            print(f"{name:10s} {by_dir['h2d']:10.2f} {by_dir['d2h']:10.2f}")
        print(
            f"kvpool / torch pinned: H2D {result['kvpool_over_torch_h2d']:.3f}, "
            f"D2H {result['kvpool_over_torch_d2h']:.3f}"
        )
    kv_buf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
