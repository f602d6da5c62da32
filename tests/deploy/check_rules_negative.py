#!/usr/bin/python3
"""Negative control of check_rules.py: on copies of the rules, their tests
and docs/OPERATIONS.md it passes the unbroken copy, then fails (exit 1) on
each copy with one edit below, with a FAIL line naming the problem.

Usage: PYTHON check_rules_negative.py RULES_YML RULES_TEST_YML OPERATIONS_MD
Exit 77 (ctest: Skipped) when check_rules.py skips (python3-yaml missing).
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "check_rules.py")

# (what, file, text, replacement, what a FAIL line must contain)
EDITS = [
    ("an alert without its alert-table row", "OPERATIONS.md",
     "| [RadixkvPagesQuarantined](#radixkvpagesquarantined) | warning |",
     "| RadixkvPagesQuarantined | warning |",
     "RadixkvPagesQuarantined: no row in the alert table"),
    ("an alert without its runbook section", "OPERATIONS.md",
     "### RadixkvHashCollisions\n", "#### Hash collisions\n",
     'RadixkvHashCollisions: no runbook section "### RadixkvHashCollisions"'),
    ("a row whose severity is not the rule's", "OPERATIONS.md",
     "| [RadixkvHashCollisions](#radixkvhashcollisions) | info |",
     "| [RadixkvHashCollisions](#radixkvhashcollisions) | warning |",
     "RadixkvHashCollisions: its alert-table row says warning, the rule info"),
    ("a row for an alert the rules do not have", "OPERATIONS.md",
     "| [RadixkvDown](#radixkvdown) |",
     "| [RadixkvGone](#radixkvdown) | critical | never |\n| [RadixkvDown](#radixkvdown) |",
     "RadixkvGone: a row of the alert table"),
    ("a runbook_url with another base", "rules.yml",
     "/OPERATIONS.md#radixkvslowacquire",
     "/OPERATIONS.html#radixkvslowacquire",
     "runbook_url bases differ"),
    ("a relative runbook_url", "rules.yml",
     "runbook_url: https://", "runbook_url: docs/x.md#y\n          x-was: https://",
     "is not <absolute base URL>#<section>"),
    ("a runbook_url pointing at another alert's section", "rules.yml",
     "#radixkvtiercopyerrors", "#radixkvtierdroppingblocks",
     "RadixkvTierCopyErrors: runbook_url points at #radixkvtierdroppingblocks"),
]


def run(d):
    p = subprocess.run([sys.executable, CHECKER, os.path.join(d, "rules.yml"),
                        os.path.join(d, "rules_test.yml"), os.path.join(d, "OPERATIONS.md")],
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 77:
        print(p.stdout + p.stderr, end="")
        sys.exit(77)
    return p


def main():
    sources = dict(zip(("rules.yml", "rules_test.yml", "OPERATIONS.md"), sys.argv[1:4]))
    failures = 0
    with tempfile.TemporaryDirectory(prefix="check_rules.") as tmp:
        def copy(name):
            d = os.path.join(tmp, name)
            os.mkdir(d)
            for base, src in sources.items():
                shutil.copy(src, os.path.join(d, base))
            return d

        p = run(copy("clean"))
        if p.returncode != 0:
            print(f"FAIL the unbroken copy does not pass (exit {p.returncode}):\n{p.stdout}{p.stderr}")
            return 1
        print("unbroken copy passes:", p.stdout.strip())
        for n, (what, name, old, new, expect) in enumerate(EDITS):
            d = copy(f"broken{n}")
            path = os.path.join(d, name)
            text = open(path, encoding="utf-8").read()
            if old not in text:
                print(f"FAIL {what}: {name} has no {old!r}")
                failures += 1
                continue
            with open(path, "w", encoding="utf-8") as f:
                f.write(text.replace(old, new, 1))
            p = run(d)
            lines = [l for l in p.stdout.splitlines() if l.startswith("FAIL:") and expect in l]
            if p.returncode != 1 or not lines:
                print(f"FAIL {what}: exit {p.returncode}, no FAIL line with {expect!r}:\n"
                      f"{p.stdout}{p.stderr}")
                failures += 1
            else:
                print(f"rejected, {what}: {lines[0]}")
    print(f"{len(EDITS) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
