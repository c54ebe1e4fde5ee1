#!/usr/bin/env python3
"""Block until the machine looks quiet (other processes use < --max-cores cores over a --window).

On a shared 2-core machine a benchmark that runs next to someone else's job is slowed
5-15x (OpenMP threads get descheduled).  Used by run_all.sh between runs.  Exits 0 when quiet,
1 on timeout (the run then goes ahead, and its own ContentionMeter records the disturbance).
"""

import argparse
import os
import sys
import time


def busy_s():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


ap = argparse.ArgumentParser()
ap.add_argument("--max-cores", type=float, default=0.15)
ap.add_argument("--window", type=float, default=3.0)
ap.add_argument("--timeout", type=float, default=300.0)
a = ap.parse_args()
t_end = time.time() + a.timeout
while True:
    b0 = busy_s()
    time.sleep(a.window)
    cores = (busy_s() - b0) / a.window
    if cores < a.max_cores:
        print(f"quiet: {cores:.2f} busy cores", flush=True)
        sys.exit(0)
    if time.time() > t_end:
        print(
            f"NOT quiet after {a.timeout:.0f}s: {cores:.2f} busy cores; running anyway", flush=True
        )
        sys.exit(1)
    print(f"waiting: {cores:.2f} busy cores", flush=True)
