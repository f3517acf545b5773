#!/usr/bin/env python3
"""The order flash attention's causal blocks start in, and what it costs.

A greedy model of a GPU's block scheduler: blocks start in the order of
their linear index (x first, then y) on the first free slot, and each takes
time proportional to its steps (key or query blocks it visits). It prints
the end of the last block for the grid with the heads along y (one head's
blocks after another's) and along x (gpu/flash_attention_kernels.cuh's
LaunchShape), against the bound max(total / slots, longest block).

    python3 bench/causal_grid_model.py [--seq-len 2048] [--batch 2] [--heads 32]
        [--kv-heads 8] [--slots 264]

264 slots: two blocks a SM on an H100's 132 (the register counts of the
dK/dV and 128-query forward kernels, 186 and 242 a thread, allow two).
A model, not a measurement: it ignores blocks sharing an SM's throughput.
"""
import argparse
import heapq


def makespan(durations, slots):
    free = [0.0] * slots
    end = 0.0
    for d in durations:
        t = heapq.heappop(free)
        heapq.heappush(free, t + d)
        end = max(end, t + d)
    return end


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--slots", type=int, default=264)
    a = ap.parse_args()
    nb = (a.seq_len + 63) // 64
    group = a.heads // a.kv_heads
    nq = (a.seq_len + 127) // 128
    kernels = [
        # name, blocks per head row, head rows, steps of block i (i = 0 starts first)
        ("forward (128 queries)", nq, a.batch * a.heads, lambda i: 2 * (nq - i)),
        ("dK/dV", nb, a.batch * a.kv_heads, lambda i: group * (nb - i)),
        ("dQ", nb, a.batch * a.heads, lambda i: nb - i),
    ]
    print(f"T={a.seq_len} B={a.batch} H={a.heads} Hkv={a.kv_heads}, {a.slots} block slots; block-steps to the end")
    print(f"{'kernel':24s} {'heads along y':>14s} {'heads along x':>14s} {'bound':>8s}")
    for name, blocks, rows, steps in kernels:
        along_y = [steps(i) for _ in range(rows) for i in range(blocks)]
        along_x = [steps(i) for i in range(blocks) for _ in range(rows)]
        bound = max(sum(along_y) / a.slots, max(along_y))
        print(f"{name:24s} {makespan(along_y, a.slots):14.0f} {makespan(along_x, a.slots):14.0f} {bound:8.1f}")


if __name__ == "__main__":
    main()
