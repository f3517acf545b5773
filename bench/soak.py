#!/usr/bin/env python3
"""Does a long zinf train run leak? A stage-3 run with the parameters and the
optimizer state on NVMe and a checkpoint every few minutes, sampled from
outside (/proc) once a minute: resident memory, locked (pinned) memory, open
file descriptors, threads and io_uring rings. After the warm-up each one
must stay within 2% of where it stood: the median of the samples in the last
checkpoint interval against the median of those in the first interval after
the warm-up. (A checkpoint's own threads and buffers come and go within
seconds; a sample that lands on one is a spike the median sets aside, while
a leak raises every sample after it. The largest values are reported too.)
Exit status 1 names what grew.

  soak.py [--minutes 30] [--warmup-minutes 5] [--checkpoint-minutes 3]
          [--interval 60] [--zinf build/zinf] [--dir DIR] [--svg soak.svg] [--json soak.json]

A first short run measures the step time, from which the checkpoint
interval in steps is set; the run is given twice the steps --minutes would
hold at that pace and is ended (SIGTERM) once --minutes have passed, so it
lasts --minutes however the machine's load changes. Progress (elapsed, samples, the latest values, ETA) goes to
stderr. Linux only (it reads /proc).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

METRICS = [("rss_mib", "resident memory", "MiB"), ("locked_mib", "locked (pinned) memory", "MiB"),
           ("fds", "open file descriptors", ""), ("threads", "threads", ""), ("io_uring_rings", "io_uring rings", "")]
TOLERANCE = 0.02


def model_flags():
    # A few hundred steps a minute on two cores; big enough that each step
    # reads and writes NVMe and the checkpoints take seconds.
    return ["--layers", "4", "--d-model", "256", "--heads", "4", "--seq-len", "128", "--micro-batch", "4",
            "--sample-tokens", "0"]


def config(nvme):
    return {"bf16": {"enabled": True},
            "zero_optimization": {"stage": 3, "sub_group_size": 1000000,
                                  "offload_param": {"device": "nvme", "nvme_path": [nvme], "max_in_cpu": 0},
                                  "offload_optimizer": {"device": "nvme", "nvme_path": [nvme], "buffer_count": 2}}}


def sample(pid):
    """The metrics of process `pid` now, or None once it is gone."""
    try:
        status = {}
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                key, _, rest = line.partition(":")
                status[key] = rest.split()
        fds = os.listdir("/proc/%d/fd" % pid)
        rings = 0
        for fd in fds:
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == "anon_inode:[io_uring]":
                    rings += 1
            except OSError:
                pass  # closed between the listing and the read
        return {"rss_mib": int(status["VmRSS"][0]) / 1024, "locked_mib": int(status["VmLck"][0]) / 1024,
                "fds": len(fds), "threads": int(status["Threads"][0]), "io_uring_rings": rings}
    except (OSError, KeyError, IndexError, ValueError):
        return None


def steps_done(metrics):
    """Steps the run has finished: the lines of its --metrics-json file."""
    try:
        with open(metrics, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def calibrate(zinf, cfg_path, work):
    """Seconds per step of this configuration (steps 5-20 of a short run)."""
    metrics = os.path.join(work, "calibrate.json")
    t0 = time.monotonic()
    r = subprocess.run([zinf, "train", "--config", cfg_path, "--steps", "20", "--metrics-json", metrics]
                       + model_flags(), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("soak: the calibration run failed (exit %d):\n%s" % (r.returncode, (r.stdout + r.stderr)[-3000:]))
    try:
        with open(metrics) as f:  # one JSON object per step
            steps = [json.loads(line) for line in f if line.strip()]
        times = sorted(s["step_seconds"] for s in steps[5:] if "step_seconds" in s)
        if times:
            return times[len(times) // 2]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return (time.monotonic() - t0) / 20  # start-up included: an overestimate, which shortens the run


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def judge(samples, warmup_s, interval_s):
    """{metric: (reference, final, growth, first_max, last_max)}: the median
    value in the first checkpoint interval after the warm-up and in the last
    one, and the largest of each."""
    after = [s for s in samples if s["t"] >= warmup_s]
    if not after:
        return None
    first = [s for s in after if s["t"] < after[0]["t"] + interval_s]
    last = [s for s in after if s["t"] > after[-1]["t"] - interval_s]
    out = {}
    for key, _, _ in METRICS:
        ref = median(s[key] for s in first)
        fin = median(s[key] for s in last)
        growth = (fin - ref) / ref if ref else (0.0 if fin == ref else float("inf"))
        out[key] = (ref, fin, growth, max(s[key] for s in first), max(s[key] for s in last))
    return out


def svg(samples, warmup_s, checkpoints, path):
    w, h, left, top, panel_h, gap = 760, 0, 70, 30, 90, 34
    h = top + len(METRICS) * (panel_h + gap) + 10
    t_end = max(s["t"] for s in samples) or 1
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
             'font-size="11">' % (w, h),
             '<text x="%d" y="18" font-size="13">zinf train soak: stage 3, parameters and optimizer on NVMe '
             '(%d samples, %.0f min)</text>' % (left, len(samples), t_end / 60)]
    pw = w - left - 20
    for i, (key, label, unit) in enumerate(METRICS):
        y0 = top + i * (panel_h + gap) + 14
        vals = [s[key] for s in samples]
        lo, hi = min(vals), max(vals)
        if hi == lo:
            lo, hi = lo - 1, hi + 1
        parts.append('<text x="%d" y="%d">%s%s</text>' % (left, y0 - 4, label, " (%s)" % unit if unit else ""))
        parts.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>' % (left, y0, pw,
                                                                                                 panel_h))
        for v in (lo, hi):
            yy = y0 + panel_h - (v - lo) / (hi - lo) * panel_h
            parts.append('<text x="%d" y="%.1f" text-anchor="end">%.4g</text>' % (left - 4, yy + 4, v))
        xw = left + warmup_s / t_end * pw
        parts.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c60" stroke-dasharray="4 3"/>'
                     % (xw, y0, xw, y0 + panel_h))
        for c in checkpoints:
            xc = left + c / t_end * pw
            parts.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#8a8" stroke-width="0.7"/>'
                         % (xc, y0 + panel_h - 6, xc, y0 + panel_h))
        pts = " ".join("%.1f,%.1f" % (left + s["t"] / t_end * pw, y0 + panel_h - (s[key] - lo) / (hi - lo) * panel_h)
                       for s in samples)
        parts.append('<polyline points="%s" fill="none" stroke="#2a5db0" stroke-width="1.5"/>' % pts)
    parts.append('<text x="%d" y="%d" fill="#666">dashed: end of warm-up; green ticks: checkpoints written; '
                 'x: 0 to %.0f minutes</text>' % (left, h - 6, t_end / 60))
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--warmup-minutes", type=float, default=5)
    ap.add_argument("--checkpoint-minutes", type=float, default=3)
    ap.add_argument("--interval", type=float, default=60, help="seconds between samples")
    ap.add_argument("--zinf", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "zinf"))
    ap.add_argument("--dir", default=os.environ.get("ZINF_TMPDIR", "/var/tmp"))
    ap.add_argument("--svg", default="soak.svg")
    ap.add_argument("--json", default="soak.json")
    args = ap.parse_args()
    if args.warmup_minutes >= args.minutes:
        sys.exit("soak: --warmup-minutes must be shorter than --minutes")
    if not os.access(args.zinf, os.X_OK):
        sys.exit("soak: %s is not an executable zinf (build it, or pass --zinf)" % args.zinf)
    work = tempfile.mkdtemp(prefix="zinf-soak-", dir=args.dir)
    try:
        nvme, ckpt = os.path.join(work, "nvme"), os.path.join(work, "ckpt")
        os.makedirs(nvme)
        cfg_path = os.path.join(work, "config.json")
        with open(cfg_path, "w") as f:
            json.dump(config(nvme), f)
        step_s = calibrate(args.zinf, cfg_path, work)
        steps = max(10, int(2 * args.minutes * 60 / step_s))
        every = max(1, int(args.checkpoint_minutes * 60 / step_s))
        print("soak: %.3f s a step: a checkpoint every %d steps, a sample every %.0f s, %.0f minutes"
              % (step_s, every, args.interval, args.minutes), file=sys.stderr)
        metrics = os.path.join(work, "metrics.json")
        cmd = [args.zinf, "train", "--config", cfg_path, "--steps", str(steps), "--save-dir", ckpt,
               "--save-every", str(every), "--keep", "2", "--metrics-json", metrics] + model_flags()
        log = open(os.path.join(work, "train.log"), "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        samples, checkpoints, seen = [], [], set()
        next_sample = 2.0  # past the exec: a sample at 0 reads the forked Python
        ended_by_us = False
        while proc.poll() is None:
            now = time.monotonic() - t0
            if now >= args.minutes * 60:
                proc.terminate()  # the run's time is up
                proc.wait()
                ended_by_us = True
                break
            if os.path.isdir(ckpt):
                for name in os.listdir(ckpt):
                    if name.startswith("step-") and not name.endswith(".tmp") and name not in seen:
                        seen.add(name)
                        checkpoints.append(now)
            if now >= next_sample:
                s = sample(proc.pid)
                if s is not None:
                    s["t"] = now
                    samples.append(s)
                    done = steps_done(metrics)
                    eta = max(0.0, args.minutes * 60 - now)
                    print("soak: %5.1f min, step %d, %d samples, %d checkpoints | rss %.0f MiB, locked %.0f MiB, %d fds, "
                          "%d threads, %d rings | ETA %.1f min" % (now / 60, done, len(samples), len(checkpoints),
                                                                 s["rss_mib"], s["locked_mib"], s["fds"],
                                                                 s["threads"], s["io_uring_rings"], eta / 60),
                          file=sys.stderr)
                next_sample += args.interval
            time.sleep(0.5)
        log.close()
        if not ended_by_us and proc.returncode == 0:
            print("soak: the run finished its %d steps after %.1f of the %.0f minutes asked (the steps sped up "
                  "after the calibration)" % (steps, (time.monotonic() - t0) / 60, args.minutes), file=sys.stderr)
        if not ended_by_us and proc.returncode != 0:
            with open(os.path.join(work, "train.log")) as f:
                tail = f.read()[-3000:]
            sys.exit("soak: zinf train exited %d:\n%s" % (proc.returncode, tail))
        verdict = judge(samples, args.warmup_minutes * 60, args.checkpoint_minutes * 60)
        if verdict is None:
            sys.exit("soak: the run ended before the warm-up did (%d samples)" % len(samples))
        svg(samples, args.warmup_minutes * 60, checkpoints, args.svg)
        grew = [k for k, v in verdict.items() if v[2] > TOLERANCE]
        with open(args.json, "w") as f:
            json.dump({"steps": steps_done(metrics), "minutes": samples[-1]["t"] / 60, "step_seconds": step_s, "checkpoint_every": every,
                       "checkpoints": len(checkpoints), "samples": samples,
                       "verdict": {k: {"reference_median": v[0], "final_median": v[1], "growth": v[2],
                                       "reference_max": v[3], "final_max": v[4]} for k, v in verdict.items()},
                       "passed": not grew}, f, indent=1)
        print("%-26s %12s %12s %9s %10s %10s" % ("after warm-up (medians)", "first", "last", "growth", "first max",
                                                 "last max"))
        for key, label, unit in METRICS:
            r, fn, g, rmax, fmax = verdict[key]
            print("%-26s %12.1f %12.1f %8.2f%% %10.1f %10.1f" % (label + (" (%s)" % unit if unit else ""), r, fn,
                                                                   100 * g, rmax, fmax))
        print("%d samples over %.1f min, %d checkpoints; plot: %s" % (len(samples), samples[-1]["t"] / 60,
                                                                      len(checkpoints), args.svg))
        if grew:
            print("soak: FAILED: grew by more than %.0f%%: %s" % (100 * TOLERANCE, ", ".join(grew)))
            return 1
        print("soak: nothing grew by more than %.0f%% after the warm-up" % (100 * TOLERANCE))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
