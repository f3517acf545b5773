#!/usr/bin/env python3
"""Runs every shell example of README.md's "## Commands" section.

An example is a fenced block whose info string is `console`: each line that
starts with "$ " is a command (a trailing backslash continues it on the next
line); every other line is what it prints, shown to the reader and not
compared. Examples that need a GPU, take longer than a minute or fail on
purpose are written in other blocks (sh, text), which are shown, not run.

Each block runs in a fresh scratch directory that mirrors the repository
root (its top-level entries are symbolic links), so `tests/fixtures/...` resolves
as in a checkout while whatever the example writes lands in the scratch
directory; the build directory comes first on PATH, as the README asks of its
reader. The commands of one block run in order in the same directory, each
under a 60-second limit, and each must exit 0.

  readme_examples.py SOURCE_DIR BUILD_DIR SCRATCH_DIR [--list]
"""
import os
import re
import shutil
import subprocess
import sys
import time

LIMIT_S = 60


def command_blocks(readme_text):
    """The commands of each ```console block in the Commands section, as
    (line number, [commands]) pairs."""
    lines = readme_text.split("\n")
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == "## Commands")
    except StopIteration:
        raise SystemExit("README.md has no '## Commands' section")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    blocks, i = [], start
    while i < end:
        if re.match(r"^\s*```console\s*$", lines[i]):
            first, cmds, i = i + 1, [], i + 1
            while i < end and not lines[i].strip().startswith("```"):
                if lines[i].startswith("$ "):
                    cmd = lines[i][2:]
                    while cmd.endswith("\\") and i + 1 < end:
                        i += 1
                        cmd = cmd[:-1] + "\n" + lines[i]
                    cmds.append(cmd)
                i += 1
            if i >= end:
                raise SystemExit(f"README.md:{first}: ```console block is not closed in the Commands section")
            blocks.append((first, cmds))
        i += 1
    return blocks


def mirror(source_dir, build_dir, scratch):
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    for name in os.listdir(source_dir):
        if name in (".git",) or name.startswith("build"):
            continue
        os.symlink(os.path.join(source_dir, name), os.path.join(scratch, name))
    os.symlink(build_dir, os.path.join(scratch, "build"))


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    source_dir, build_dir, scratch_root = (os.path.abspath(a) for a in sys.argv[1:4])
    with open(os.path.join(source_dir, "README.md"), encoding="utf-8") as f:
        blocks = command_blocks(f.read())
    total = sum(len(c) for _, c in blocks)
    if "--list" in sys.argv[4:]:
        for line, cmds in blocks:
            for c in cmds:
                print(f"README.md:{line}: $ {c}")
        return 0
    if total == 0:
        print("FAIL: README.md's Commands section has no ```console example to run")
        return 1
    env = dict(os.environ, PATH=build_dir + os.pathsep + os.environ.get("PATH", ""))
    passed = failed = 0
    for n, (line, cmds) in enumerate(blocks):
        scratch = os.path.join(scratch_root, f"readme-example-{n}")
        mirror(source_dir, build_dir, scratch)
        for cmd in cmds:
            t0 = time.monotonic()
            try:
                r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=scratch, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=LIMIT_S)
                code, out = r.returncode, r.stdout
            except subprocess.TimeoutExpired as e:
                code, out = f"timed out after {LIMIT_S} s", (e.stdout or b"").decode(errors="replace")
            dt = time.monotonic() - t0
            if code == 0:
                passed += 1
                print(f"ok    {dt:5.1f} s  README.md:{line}: $ {cmd}")
            else:
                failed += 1
                print(f"FAIL  {dt:5.1f} s  README.md:{line}: $ {cmd}\n  exit: {code}\n  output:\n"
                      + "\n".join("    " + l for l in out.rstrip().split("\n")[-40:]))
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
