#!/usr/bin/env bash
# zinf aio against fio on one pre-written file, same settings, interleaved.
#
#   bench/aio_vs_fio.sh [DIR]        (default DIR: .)
#
# For each case BLOCK:QD:THREADS (default "1M:16:1 8M:32:2"; override with
# CASES=...) and for write and read, runs ROUNDS (default 5) rounds of
# `zinf aio` and `fio --ioengine=io_uring --direct=1` alternately on the same
# SIZE (default 4G) file, then prints each median, the ratio zinf/fio, and
# CPU seconds per GB moved for both (getrusage of the child, so both are
# measured the same way). Which tool runs first alternates every round, since
# virtual disks may cache on the host and favour whichever runs second. fio's numjobs=THREADS jobs each get their own region
# (offset_increment), as zinf aio's threads do. Installs fio with apt-get if
# it is missing. ZINF points at the zinf binary (default: build/zinf).
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
# HUGEPAGES=N (root) adds N 2 MiB pages to the hugetlb pool for the run and
# gives them back afterwards; both tools then take their buffers from it
# (zinf by itself, fio with --iomem=shmhuge). 300 covers 8M x qd 32 x 2
# threads. On a VM whose balloon reports free memory to the host, a fresh
# transparent huge page is faulted on the host too (1.2 s of system time per
# 512 MiB here); pool pages are not (0.08 s): cpu/io_memory.h.
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
HUGEPAGES=${HUGEPAGES:-0}
POOL=/proc/sys/vm/nr_hugepages
OLD_POOL=$(cat "$POOL")
FIO_IOMEM=""
cleanup() {
  rm -f "$FILE"
  if [[ $HUGEPAGES -gt 0 ]]; then echo "$OLD_POOL" > "$POOL"; fi
}
trap cleanup EXIT
if [[ $HUGEPAGES -gt 0 ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "aio_vs_fio: HUGEPAGES needs root (it writes $POOL)" >&2; exit 1; }
  echo $((OLD_POOL + HUGEPAGES)) > "$POOL"
  got=$(cat "$POOL")
  [[ $got -ge $((OLD_POOL + HUGEPAGES)) ]] || { echo "aio_vs_fio: the kernel gave $got of $((OLD_POOL + HUGEPAGES)) huge pages" >&2; exit 1; }
  FIO_IOMEM="--iomem=shmhuge"
  echo "# hugetlb pool: $OLD_POOL + $HUGEPAGES pages of 2 MiB for this run (fio $FIO_IOMEM)"
fi
echo "# aio_vs_fio: $FILE, $SIZE x $LOOPS pass(es) per run, $ROUNDS rounds per case, $(fio --version), $("$ZINF" --version | head -1)${ZINF_ARGS:+, zinf aio $ZINF_ARGS}"
echo "# pre-writing the file once (every extent written: no read touches an unwritten extent)"
"$ZINF" aio write --path "$FILE" --size "$SIZE" --block-size 8M --queue-depth 32 --threads 2 --loops 1 >/dev/null

python3 - "$ZINF" "$FILE" "$SIZE" "$ROUNDS" "$CASES" "$FIO_IOMEM" "${ZINF_ARGS:-}" "$LOOPS" <<'PY'
import json, resource, statistics, subprocess, sys

zinf, path, size_text, rounds, cases = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split()
fio_extra = sys.argv[6].split()
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

def run_fio(op, bs, qd, threads):
    per_job = size // threads
    c0 = child_cpu()
    out = subprocess.run(["fio", "--name=ref", "--filename=" + path, "--rw=" + op, "--bs=" + str(parse(bs)),
                          "--iodepth=" + str(qd), "--numjobs=" + str(threads), "--size=" + str(per_job),
                          "--offset_increment=" + str(per_job), "--loops=" + str(loops), "--ioengine=io_uring", "--direct=1",
                          "--group_reporting", "--output-format=json"] + fio_extra,
                         capture_output=True, text=True, check=True)
    cpu = child_cpu() - c0
    side = json.loads(out.stdout)["jobs"][0][op]
    return side["bw_bytes"] / 1e9, cpu / (side["io_bytes"] / 1e9)

print(f"{'block':>6} {'qd':>3} {'thr':>3} {'op':<5} {'zinf GB/s':>10} {'fio GB/s':>9} {'ratio':>6} "
      f"{'zinf cpu s/GB':>13} {'fio cpu s/GB':>12}  rounds (zinf | fio)")
for case in cases:
    bs, qd, threads = case.split(":")
    for op in ("write", "read"):
        z, f, zc, fc = [], [], [], []
        for r in range(rounds):
            # Alternate who goes first: this VM's disk caches on the host side,
            # so the second run of a pair can read what the first one warmed.
            order = (run_zinf, run_fio) if r % 2 == 0 else (run_fio, run_zinf)
            for run in order:
                a, b = run(op, bs, int(qd), int(threads))
                (z if run is run_zinf else f).append(a)
                (zc if run is run_zinf else fc).append(b)
        zm, fm = statistics.median(z), statistics.median(f)
        print(f"{bs:>6} {qd:>3} {threads:>3} {op:<5} {zm:>10.3f} {fm:>9.3f} {zm / fm:>6.3f} "
              f"{statistics.median(zc):>13.4f} {statistics.median(fc):>12.4f}  "
              f"{' '.join(f'{x:.2f}' for x in z)} | {' '.join(f'{x:.2f}' for x in f)}", flush=True)
PY
