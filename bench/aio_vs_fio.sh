#!/usr/bin/env bash
# zinf aio against fio on one pre-written file, same settings, interleaved.
#
#   bench/aio_vs_fio.sh [DIR]        (default DIR: .)
#
# For each case BLOCK:QD:THREADS (default "1M:16:1 8M:32:2"; override with
# CASES=...) and for write and read, runs ROUNDS (default 5) rounds of
# `zinf aio` and of `fio --ioengine=io_uring --direct=1` (in the two buffer
# pairings below) on the same SIZE (default 4G) file, then prints each
# median, the ratios zinf/fio, and CPU seconds per GB moved for each
# (getrusage of the child, so all are measured the same way). Which tool runs
# first rotates every round, since virtual disks may cache on the host and
# favour whichever runs later. fio's numjobs=THREADS jobs each get their own
# region (offset_increment), as zinf aio's threads do. Installs fio with
# apt-get if it is missing. ZINF points at the zinf binary (default:
# build/zinf).
#
# ZINF_ARGS adds options to every `zinf aio` run (e.g. "--single-submit",
# which submits each block on its own as fio does by default, so the kernel
# does not merge neighbouring blocks).
#
# LOOPS=N (default 1) makes every run of both tools pass over the file N
# times (zinf --loops N, fio --loops=N): a run's fixed costs, above all the
# first touch of its fresh buffers (512 MiB at 8M x qd 32 x 2 threads), are
# then spread over N times the bytes, so CPU s/GB approaches the rate of the
# I/O path itself. GB/s is then bytes over the time of all passes, for both.
#
# Two pairings, both by default, since on a VM buffer memory can decide the
# figure more than the I/O engine does (O_DIRECT requests from 4 KiB pages
# are split per page; from huge pages they reach the disk whole):
#   - like for like: fio with --iomem=shmhuge, its buffers in 2 MiB pages from
#     the hugetlb pool, as zinf's are (zinf takes pool pages by itself when the
#     pool has them: cpu/io_memory.h). This is the figure to quote.
#   - fio as it runs by default, its buffers in 4 KiB pages: what a user of
#     fio's defaults sees, not a comparison of the two engines.
# For that the script adds pages to the hugetlb pool for the run (root) and
# gives them back afterwards: HUGEPAGES=N pages of 2 MiB, default enough for
# the largest case (BLOCK x QD x THREADS, plus 16). HUGEPAGES=0 reserves
# none and runs only the second pairing (zinf then on transparent huge
# pages); without root that is the only choice. On a VM whose balloon
# reports free memory to the host, a fresh transparent huge page is faulted
# on the host too (1.2 s of system time per 512 MiB here); pool pages are not
# (0.08 s).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DIR=${1:-.}
ZINF=${ZINF:-$here/../build/zinf}
ROUNDS=${ROUNDS:-5}
SIZE=${SIZE:-4G}
CASES=${CASES:-"1M:16:1 8M:32:2"}
LOOPS=${LOOPS:-1}
[[ $LOOPS =~ ^[1-9][0-9]*$ ]] || { echo "aio_vs_fio: LOOPS must be a positive integer (got '$LOOPS')" >&2; exit 2; }

if ! command -v fio >/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "aio_vs_fio: installing fio" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && apt-get install -y -q fio >/dev/null
  else
    echo "aio_vs_fio: fio is missing; run as root: apt-get install fio" >&2
    exit 1
  fi
fi
[[ -x "$ZINF" ]] || { echo "aio_vs_fio: no zinf binary at $ZINF (build first: scripts/build)" >&2; exit 1; }
[[ -d "$DIR" ]] || { echo "aio_vs_fio: $DIR is not a directory" >&2; exit 2; }

FILE="$DIR/zinf_aio_vs_fio.dat"
# Pages for the largest case's buffers (each tool runs alone, so one set).
size_bytes() {
  local t=$1 n=${1%[KkMmGg]}
  case ${t: -1} in K|k) echo $((n << 10)) ;; M|m) echo $((n << 20)) ;; G|g) echo $((n << 30)) ;; *) echo "$t" ;; esac
}
pages_needed=0
for c in $CASES; do
  IFS=: read -r bs qd thr <<<"$c"
  p=$(( ($(size_bytes "$bs") * qd * thr + (2 << 20) - 1) / (2 << 20) ))
  (( p > pages_needed )) && pages_needed=$p
done
if [[ -z ${HUGEPAGES:-} ]]; then
  if [[ $(id -u) -eq 0 ]]; then HUGEPAGES=$((pages_needed + 16)); else
    echo "aio_vs_fio: the like-for-like pairing (fio --iomem=shmhuge) needs root to add huge pages to the pool;" \
         "run as root, or HUGEPAGES=0 for the default-buffer pairing alone" >&2
    exit 1
  fi
fi
[[ $HUGEPAGES =~ ^[0-9]+$ ]] || { echo "aio_vs_fio: HUGEPAGES must be a number of 2 MiB pages (got '$HUGEPAGES')" >&2; exit 2; }
POOL=/proc/sys/vm/nr_hugepages
OLD_POOL=$(cat "$POOL")
cleanup() {
  rm -f "$FILE"
  if [[ $HUGEPAGES -gt 0 ]]; then echo "$OLD_POOL" > "$POOL"; fi
}
trap cleanup EXIT
if [[ $HUGEPAGES -gt 0 ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "aio_vs_fio: HUGEPAGES needs root (it writes $POOL)" >&2; exit 1; }
  (( HUGEPAGES >= pages_needed )) || echo "# note: HUGEPAGES=$HUGEPAGES is below the $pages_needed pages the largest case needs; a tool short of pool pages falls back (zinf) or fails (fio)" >&2
  echo $((OLD_POOL + HUGEPAGES)) > "$POOL"
  got=$(cat "$POOL")
  [[ $got -ge $((OLD_POOL + HUGEPAGES)) ]] || { echo "aio_vs_fio: the kernel gave $got of $((OLD_POOL + HUGEPAGES)) huge pages" >&2; exit 1; }
  echo "# hugetlb pool: $OLD_POOL + $HUGEPAGES pages of 2 MiB for this run; zinf takes its buffers from it, fio with --iomem=shmhuge too"
else
  echo "# HUGEPAGES=0: no hugetlb pool, so only fio with default (4 KiB-page) buffers runs; that pairing compares buffer memory as much as I/O engines"
fi
echo "# aio_vs_fio: $FILE, $SIZE x $LOOPS pass(es) per run, $ROUNDS rounds per case, $(fio --version), $("$ZINF" --version | head -1)${ZINF_ARGS:+, zinf aio $ZINF_ARGS}"
echo "# pre-writing the file once (every extent written: no read touches an unwritten extent)"
"$ZINF" aio write --path "$FILE" --size "$SIZE" --block-size 8M --queue-depth 32 --threads 2 --loops 1 >/dev/null

python3 - "$ZINF" "$FILE" "$SIZE" "$ROUNDS" "$CASES" "$HUGEPAGES" "${ZINF_ARGS:-}" "$LOOPS" <<'PY'
import json, resource, statistics, subprocess, sys

zinf, path, size_text, rounds, cases = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split()
huge = int(sys.argv[6]) > 0
zinf_extra = sys.argv[7].split()
loops = int(sys.argv[8])
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
def parse(t):
    return int(float(t[:-1]) * units[t[-1].upper()]) if t[-1].upper() in units else int(t)
size = parse(size_text)

def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def run_zinf(op, bs, qd, threads):
    c0 = child_cpu()
    out = subprocess.run([zinf, "aio", op, "--path", path, "--size", str(size), "--block-size", bs,
                          "--queue-depth", str(qd), "--threads", str(threads), "--loops", str(loops), "--json"] + zinf_extra,
                         capture_output=True, text=True, check=True)
    cpu = child_cpu() - c0
    seconds = sum(l["seconds"] for l in json.loads(out.stdout)["loops"])
    return size * loops / seconds / 1e9, cpu / (size * loops / 1e9)

def fio(iomem):
    def run(op, bs, qd, threads):
        per_job = size // threads
        c0 = child_cpu()
        out = subprocess.run(["fio", "--name=ref", "--filename=" + path, "--rw=" + op, "--bs=" + str(parse(bs)),
                              "--iodepth=" + str(qd), "--numjobs=" + str(threads), "--size=" + str(per_job),
                              "--offset_increment=" + str(per_job), "--loops=" + str(loops), "--ioengine=io_uring",
                              "--direct=1", "--group_reporting", "--output-format=json"] + iomem,
                             capture_output=True, text=True, check=True)
        cpu = child_cpu() - c0
        side = json.loads(out.stdout)["jobs"][0][op]
        return side["bw_bytes"] / 1e9, cpu / (side["io_bytes"] / 1e9)
    return run

# Columns: zinf; fio with huge-page buffers (like for like; only with a
# pool); fio with its default 4 KiB-page buffers.
tools = [("zinf", run_zinf)] + ([("fio huge", fio(["--iomem=shmhuge"]))] if huge else []) + [("fio 4K", fio([]))]
print("# GB/s are medians over the rounds; ratio = zinf / fio; cpu = CPU seconds per GB moved (getrusage of the child)")
head = f"{'block':>6} {'qd':>3} {'thr':>3} {'op':<5} {'zinf GB/s':>10}"
if huge:
    head += f" {'fio huge':>9} {'ratio':>6}"
head += f" {'fio 4K':>7} {'ratio':>6}  cpu s/GB zinf" + (" | fio huge" if huge else "") + " | fio 4K   rounds GB/s (" + " | ".join(n for n, _ in tools) + ")"
print(head)
for case in cases:
    bs, qd, threads = case.split(":")
    for op in ("write", "read"):
        rate = {n: [] for n, _ in tools}
        cpu = {n: [] for n, _ in tools}
        for r in range(rounds):
            # Rotate who goes first: this VM's disk caches on the host side,
            # so a later run of a round can read what an earlier one warmed.
            k = r % len(tools)
            for name, run in tools[k:] + tools[:k]:
                a, b = run(op, bs, int(qd), int(threads))
                rate[name].append(a)
                cpu[name].append(b)
        med = {n: statistics.median(v) for n, v in rate.items()}
        line = f"{bs:>6} {qd:>3} {threads:>3} {op:<5} {med['zinf']:>10.3f}"
        if huge:
            line += f" {med['fio huge']:>9.3f} {med['zinf'] / med['fio huge']:>6.3f}"
        line += f" {med['fio 4K']:>7.3f} {med['zinf'] / med['fio 4K']:>6.3f}  "
        line += " | ".join(f"{statistics.median(cpu[n]):.4f}" for n, _ in tools)
        line += "   " + " | ".join(" ".join(f"{x:.2f}" for x in rate[n]) for n, _ in tools)
        print(line, flush=True)
PY
