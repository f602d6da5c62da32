#!/usr/bin/env python3
"""Checks that an installed include tree is closed under its own includes.

Usage: scripts/check_installed_headers.py INCLUDE_DIR [--source-dir DIR]
                                          [--absent PATH ...]
  INCLUDE_DIR   the include directory of an installed radixkv package
                (<prefix>/include)
  --source-dir  the repository: its top-level directories (daemon, worker,
                tests, ...) count as radixkv's own include roots too
  --absent      a header (relative to INCLUDE_DIR) that must not be
                installed: a library's private header

Every `#include "..."` and `#include <...>` line of every header under
INCLUDE_DIR whose path starts with one of radixkv's include roots (the
top-level directories of INCLUDE_DIR itself, e.g. base/, client/, gpu/,
radix/, radixkv/, and with --source-dir those of the repository) must name
a header that is installed; includes of other libraries (absl/, grpcpp/,
google/protobuf/, <cstdint>) are left to the consumer's compiler.

Prints `FILE:LINE: includes X, which is not installed` for each miss (FILE
relative to INCLUDE_DIR) and `FILE: private header installed` for each
--absent header found, then `check_installed_headers: N headers, K
problems`; exits 1 if K > 0. Standard library only.
"""

import argparse
import os
import re
import sys

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')
HEADER_EXTS = (".h", ".hh", ".hpp", ".inc")


def installed_headers(include_dir):
    for dirpath, dirnames, filenames in os.walk(include_dir):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(HEADER_EXTS):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, include_dir).replace(os.sep, "/")


def project_roots(include_dir, source_dir):
    roots = {e for e in os.listdir(include_dir)
             if os.path.isdir(os.path.join(include_dir, e))}
    if source_dir:
        roots |= {e for e in os.listdir(source_dir)
                  if os.path.isdir(os.path.join(source_dir, e))
                  and not e.startswith((".", "_")) and e != "build"}
    return roots


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("include_dir")
    ap.add_argument("--source-dir")
    ap.add_argument("--absent", action="append", default=[])
    args = ap.parse_args(argv)

    include_dir = args.include_dir
    if not os.path.isdir(include_dir):
        print(f"check_installed_headers: {include_dir}: no such directory")
        return 2
    roots = project_roots(include_dir, args.source_dir)
    headers = list(installed_headers(include_dir))
    present = set(headers)
    problems = 0
    for rel in headers:
        with open(os.path.join(include_dir, rel), errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                target = m.group(1) or m.group(2)
                if target.split("/", 1)[0] not in roots or "/" not in target:
                    continue
                if target not in present:
                    print(f"{rel}:{lineno}: includes {target}, "
                          "which is not installed")
                    problems += 1
    for rel in args.absent:
        if rel in present:
            print(f"{rel}: private header installed")
            problems += 1
    print(f"check_installed_headers: {len(headers)} headers, "
          f"{problems} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
