"""Cold start of the packaged client to its first line, beside the same client run by Python.

    python -m mobile_export.coldstart DIR/flashnpc-client [--bundle PATH] [--runs 5]

Starts each command ``--runs`` times in a fresh process (the packaged one with an empty
environment), the two interleaved so that a change in the machine's load hits both alike, and
measures wall time from spawn to the first NPC line on stdout. Prints the
median and minimum of each, and the ratio packaged / interpreter. The peer is
``python -m mobile_export.client_main`` on the packaged bundle (or ``--bundle``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


def time_to_first_line(cmd: list[str], env: dict[str, str] | None, cwd: Path) -> float:
    """Seconds from spawning ``cmd`` to its first stdout line holding an NPC line (`` / ``)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, cwd=cwd)
    assert proc.stdout is not None
    elapsed = None
    for line in proc.stdout:
        if " / " in line:
            elapsed = time.perf_counter() - t0
            break
    proc.stdout.close()
    if proc.wait() != 0 or elapsed is None:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode} without printing a line")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("executable", type=Path)
    parser.add_argument("--bundle", type=Path, default=None,
                        help="bundle for the interpreter peer (default: the packaged one)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    exe = args.executable.resolve()
    bundle = args.bundle or exe.parent / "_internal" / "bundle"
    cwd = exe.parent.parent
    peer_cmd = [sys.executable, "-m", "mobile_export.client_main", "demo", "--lines", "1",
                "--bundle", str(bundle)]
    packaged: list[float] = []
    peer: list[float] = []
    for _ in range(args.runs):
        packaged.append(time_to_first_line([str(exe), "demo", "--lines", "1"], {}, cwd))
        peer.append(time_to_first_line(peer_cmd, dict(os.environ), cwd))
    size = sum(p.stat().st_size for p in exe.parent.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"build size: {size / 1e6:.1f} MB ({exe.parent})")
    for name, runs in (("packaged client", packaged), ("python -m mobile_export.client_main", peer)):
        print(f"{name}: spawn to first line median {statistics.median(runs) * 1e3:.0f} ms, "
              f"min {min(runs) * 1e3:.0f} ms over {len(runs)} runs")
    print(f"ratio packaged / interpreter (median): {statistics.median(packaged) / statistics.median(peer):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
