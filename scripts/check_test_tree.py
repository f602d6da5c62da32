#!/usr/bin/env python3
"""Checks that the test tree mirrors the source tree.

Usage: scripts/check_test_tree.py [ROOT]
  ROOT  the repository (default: the directory above this script's)

Every source folder that builds something (a CMakeLists.txt with
add_library or add_executable under base/, radix/, gpu/, proto/, daemon/,
client/, worker/ or python/) must have a folder of the same path under
tests/ whose CMakeLists.txt registers at least one test (add_test,
gtest_discover_tests or a helper of tests/ that calls them). python/
builds its package with add_custom_target and counts too.

Prints `MISSING tests/PATH (for PATH)` or `NO TESTS tests/PATH/CMakeLists.txt`
for each folder that breaks the rule, then `check_test_tree: N source
folders, K without tests`; exits 1 if K > 0. Standard library only.
"""

import os
import re
import sys

SOURCE_ROOTS = ("base", "radix", "gpu", "proto", "daemon", "client", "worker",
                "python")
BUILDS = re.compile(r"^\s*(add_library|add_executable|add_custom_target)\s*\(",
                    re.MULTILINE)
# A test registration, or a call of a function that tests/ defines to make
# one (radixkv_fuzzer and the like all end in add_test).
REGISTERS = re.compile(r"^\s*(add_test|gtest_discover_tests|radixkv_\w+)\s*\(",
                       re.MULTILINE)


def source_folders(root):
    for top in SOURCE_ROOTS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames
                                 if not d.startswith((".", "__")))
            if "CMakeLists.txt" not in filenames:
                continue
            with open(os.path.join(dirpath, "CMakeLists.txt")) as f:
                if BUILDS.search(f.read()):
                    yield os.path.relpath(dirpath, root)


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    folders = list(source_folders(root))
    bad = 0
    for rel in folders:
        tests = os.path.join(root, "tests", rel)
        cml = os.path.join(tests, "CMakeLists.txt")
        if not os.path.isdir(tests):
            print(f"MISSING tests/{rel} (for {rel})")
            bad += 1
            continue
        text = open(cml).read() if os.path.isfile(cml) else ""
        if not REGISTERS.search(text):
            print(f"NO TESTS tests/{rel}/CMakeLists.txt")
            bad += 1
    print(f"check_test_tree: {len(folders)} source folders, {bad} without tests")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
