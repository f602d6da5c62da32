#!/usr/bin/python3
"""README.md's commands work on a fresh Debian 12 checkout, as written.

Usage: check_readme.py ROOT              # check ROOT/README.md
       check_readme.py --negative ROOT   # the negative control

- "## Set-up (fresh Debian 12)" holds exactly two commands (one per ```sh
  block);
- every build/default/<dir>/<program> a ```sh block runs is built by
  scripts/run_daemon.sh (its `--target` list), or by a `cmake --build ...
  --target` earlier in that block;
- no ```sh block spells out the daemon's default socket path
  (/tmp/radixkv-<uid>, $XDG_RUNTIME_DIR/radixkv, /run/radixkv/radixkvd.sock):
  the path depends on the machine, and `radixkvctl endpoint` prints it.
Each problem is printed as `README.md:LINE: why`; exit 1 when there is one.
--negative runs the check on temporary copies of README.md and
scripts/run_daemon.sh, each broken one way, and fails unless every broken
copy is refused with the expected message (and the unbroken one passes).
Standard library only.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

SETUP = "## Set-up (fresh Debian 12)"
SOCKET_BY_HAND = re.compile(r"/tmp/radixkv-|XDG_RUNTIME_DIR|/run/radixkv/radixkvd\.sock")
PROGRAM = re.compile(r"(?:^|[\s;&|(`$])build/default/[\w./-]*?/([\w-]+)(?=[\s;&|)`]|$)")


def sh_blocks(lines):
    """(first line number, [lines]) of each ```sh block, and the section
    each starts in."""
    blocks, current, section = [], None, ""
    for n, line in enumerate(lines, 1):
        if current is None and line.startswith("## "):
            section = line.strip()
        if current is None and line.strip() == "```sh":
            current = (n + 1, [], section)
        elif current is not None and line.startswith("```"):
            blocks.append(current)
            current = None
        elif current is not None:
            current[1].append(line)
    return blocks


def commands(block_lines):
    """The block's command lines: not blank, not comments, not the body of
    a here-document, continuation lines joined."""
    out, heredoc, joined = [], None, ""
    for line in block_lines:
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        joined += line
        if joined.endswith("\\"):
            joined = joined[:-1] + " "
            continue
        m = re.search(r"<<-?\s*'?\"?(\w+)", joined)
        if m:
            heredoc = m.group(1)
        out.append(joined)
        joined = ""
    return out


def run_daemon_targets(root):
    text = open(os.path.join(root, "scripts", "run_daemon.sh"), encoding="utf-8").read()
    targets = set()
    for m in re.finditer(r"cmake --build[^\n]*--target((?:[ \t]+[\w-]+)+)", text):
        targets.update(m.group(1).split())
    return targets


def check(root):
    path = os.path.join(root, "README.md")
    lines = open(path, encoding="utf-8").read().split("\n")
    built = run_daemon_targets(root)
    problems = []
    blocks = sh_blocks(lines)
    setup = [b for b in blocks if b[2] == SETUP]
    setup_commands = [c for b in setup for c in commands(b[1])]
    if len(setup_commands) != 2 or any(len(commands(b[1])) != 1 for b in setup):
        problems.append(f"README.md:{setup[0][0] if setup else 1}: \"{SETUP}\" must hold "
                        f"exactly two commands, one per block; it holds "
                        f"{len(setup_commands)}")
    for first, block, _ in blocks:
        block_built = set()
        for offset, line in enumerate(block):
            n = first + offset
            for m in re.finditer(r"cmake --build[^\n]*--target((?:[ \t]+[\w-]+)+)", line):
                block_built.update(m.group(1).split())
            if line.lstrip().startswith("#"):
                continue
            if SOCKET_BY_HAND.search(line):
                problems.append(f"README.md:{n}: spells out the default socket path; "
                                "print it with `radixkvctl endpoint`")
            for m in PROGRAM.finditer(line):
                program = m.group(1)
                if program not in built and program not in block_built:
                    problems.append(f"README.md:{n}: runs {program}, which "
                                    f"scripts/run_daemon.sh does not build "
                                    f"(its targets: {' '.join(sorted(built)) or 'none'})")
    for p in problems:
        print(p)
    print(f"check_readme: {len(blocks)} sh blocks, {len(problems)} problem(s)")
    return 1 if problems else 0


# (what, file, text, replacement, what a problem line must contain)
BROKEN = [
    ("run_daemon.sh builds radixkvd alone", "scripts/run_daemon.sh",
     "--target radixkvd radixkvctl radixkv-worker", "--target radixkvd",
     "runs radixkvctl, which scripts/run_daemon.sh does not build"),
    ("the socket path computed by hand", "README.md",
     "S=$(build/default/client/radixkvctl endpoint)",
     "S=unix:/tmp/radixkv-$(id -u)/radixkvd.sock",
     "spells out the default socket path"),
    ("a third set-up command", "README.md",
     "```sh\nscripts/test.sh\n```",
     "```sh\nscripts/test.sh\n```\n\n```sh\nscripts/install_deps.sh\n```",
     "must hold exactly two commands, one per block; it holds 3"),
]


def negative(root):
    failures = 0
    with tempfile.TemporaryDirectory(prefix="check_readme.") as tmp:
        def copy(name):
            d = os.path.join(tmp, name)
            os.makedirs(os.path.join(d, "scripts"))
            shutil.copy(os.path.join(root, "README.md"), d)
            shutil.copy(os.path.join(root, "scripts", "run_daemon.sh"), os.path.join(d, "scripts"))
            return d

        def run(d):
            return subprocess.run([sys.executable, os.path.abspath(__file__), d],
                                  capture_output=True, text=True, timeout=60)

        p = run(copy("clean"))
        if p.returncode != 0:
            print(f"FAIL the unbroken copy does not pass:\n{p.stdout}{p.stderr}")
            return 1
        for n, (what, rel, old, new, expect) in enumerate(BROKEN):
            d = copy(f"broken{n}")
            path = os.path.join(d, rel)
            text = open(path, encoding="utf-8").read()
            if text.count(old) != 1:
                print(f"FAIL {what}: {rel} has {text.count(old)} copies of {old!r}, not 1")
                failures += 1
                continue
            with open(path, "w", encoding="utf-8") as f:
                f.write(text.replace(old, new))
            p = run(d)
            hits = [l for l in p.stdout.splitlines() if expect in l]
            if p.returncode != 1 or not hits:
                print(f"FAIL {what}: exit {p.returncode}, no line with {expect!r}:\n{p.stdout}")
                failures += 1
            else:
                print(f"rejected, {what}: {hits[0]}")
    print(f"{len(BROKEN) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--negative":
        sys.exit(negative(sys.argv[2]))
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    sys.exit(check(sys.argv[1]))
