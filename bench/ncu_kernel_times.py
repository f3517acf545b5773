#!/usr/bin/env python3
"""Each kernel's share of a profiled run, from Nsight Compute's raw CSV.

    ncu --metrics gpu__time_duration.sum --csv --page raw CMD... > trace.csv
    python3 bench/ncu_kernel_times.py trace.csv [--top 30]

Sums gpu__time_duration over the launches of each kernel (its name up to
the template arguments) and prints the kernels by total time: milliseconds,
share, launches and the mean per launch. Lines before the CSV header (the
profiled program's own output) are skipped.
"""
import argparse
import collections
import csv
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = list(csv.reader(f))
    header = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if header is None:
        sys.exit(f"{a.csv}: no 'Kernel Name' column (not ncu --csv --page raw output?)")
    names = rows[header]
    name_col = names.index("Kernel Name")
    time_col = next((i for i, c in enumerate(names) if c.startswith("gpu__time_duration")), None)
    if time_col is None:
        sys.exit(f"{a.csv}: no gpu__time_duration column (profile with --metrics gpu__time_duration.sum)")
    unit = rows[header + 1][time_col] if header + 1 < len(rows) else ""
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(unit.strip(), 1e-6)
    total = collections.defaultdict(float)
    count = collections.Counter()
    for r in rows[header + 1:]:
        if len(r) <= max(name_col, time_col):
            continue
        try:
            t = float(r[time_col].replace(",", "")) * scale
        except ValueError:
            continue  # the units row
        name = r[name_col].split("(")[0].split("<")[0].strip()
        total[name] += t
        count[name] += 1
    all_ms = sum(total.values())
    print(f"# {sum(count.values())} launches of {len(total)} kernels, {all_ms:.3f} ms of kernel time")
    print(f"{'ms':>9s} {'share':>6s} {'launches':>8s} {'us each':>9s}  kernel")
    for name, ms in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{ms:9.3f} {100 * ms / all_ms:5.1f}% {count[name]:8d} {1e3 * ms / count[name]:9.1f}  {name}")


if __name__ == "__main__":
    main()
