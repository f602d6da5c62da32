#!/usr/bin/env python3
"""Checks that every production file includes only what its library links.

Usage: scripts/check_includes.py --build-dir DIR [--source-dir DIR]
                                 [--graphviz FILE] [--cmake CMAKE]
  --build-dir   a configured build tree of the repository (its
                compile_commands.json is read)
  --source-dir  the repository (default: the directory above this script's)
  --graphviz    the build's link graph, as `cmake --graphviz=FILE` writes it;
                without it the checker runs `CMAKE --graphviz=TMP BUILD_DIR`
                (a re-configure of the build tree, which changes no file
                whose content stays the same)
  --cmake       the cmake to run (default: the build's CMAKE_COMMAND)

Production files are the .h, .cc and .cu files under base/, radix/, gpu/,
proto/, daemon/, client/, worker/ and bench/. For each file the checker
knows the libraries it is compiled into, all from CMake:

- the link graph is CMake's own (--graphviz): solid edges are PUBLIC, dashed
  INTERFACE and dotted PRIVATE link dependencies. Target T may include the
  headers of T itself, of every target it links directly, and of every
  target those pass on through PUBLIC or INTERFACE links, transitively;
- a .cc or .cu file belongs to the production targets whose compile
  commands build it (compile_commands.json; a target defined under tests/
  that compiles production sources is a test, not a production target);
- a header belongs to the production target that compiles the source of the
  same name beside it, else to the one production target compiling sources
  in its folder, else to the one library (or the one target) that the
  nearest CMakeLists.txt above it defines; a header that no target owns
  (bench/bench_json.h) is checked in the context of each file including it.
  A file not compiled in this configuration belongs to its header-like
  owner; a file whose owner is not in this configuration's graph (gpu_bench
  without CUDA) is skipped.

Each `#include "..."` or `#include <...>` of a production file is resolved
against the project's include directories (those of the compile commands
inside the repository or the build tree, so generated radixkv/v1/*.pb.h and
grpc/health/v1/*.pb.h belong to radixkv_proto and proto/radixkv/x.h is
"radixkv/x.h"). A project header's owner must be the including target or
visible to it as above; tests/ is never visible to production code. An
external header must come from a package the target links (absl/ from an
absl:: target, grpcpp/ from gRPC::, google/protobuf/ from protobuf::,
prometheus/ from prometheus-cpp::, CUDA headers from CUDA::, nlohmann/,
CLI/, benchmark/, gtest/, xxhash.h, zmq.hpp, systemd/); a package that is
not in this configuration's graph at all is not checked. On top of that,
by rule:

- radix/ includes no grpc/, grpcpp/, google/protobuf/, prometheus/ or CUDA
  header (the index knows nothing of gRPC, protobuf, Prometheus or CUDA);
- daemon/tiers/ includes no grpc/, grpcpp/, google/protobuf/ or
  radixkv/v1/ header (the tiers link no gRPC or protobuf);
- base/ includes only base/, absl/ and standard headers.

Prints each violation as
  `FILE:LINE: includes X (owned by L) but T does not link L` or
  `FILE:LINE: includes X (owned by L) but T must not include it: RULE`
(FILE relative to the repository), then `check_includes: N files, M
includes, K violations`; exits 1 if K > 0, 2 on a usage or setup error.
Standard library only.
"""

import argparse
import collections
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

PRODUCTION_ROOTS = ("base", "radix", "gpu", "proto", "daemon", "client",
                    "worker", "bench")
# Folders that must resolve to an owning target whenever they exist.
LIBRARY_FOLDERS = ("base", "radix", "gpu", "proto", "daemon/tiers",
                   "daemon/events", "daemon/trust", "daemon/core",
                   "daemon/rpc", "client", "client/ctl", "worker")
SOURCE_EXTS = (".cc", ".cu", ".cpp")
HEADER_EXTS = (".h", ".cuh", ".hpp")
SKIP_DIRS = ("build", "data", "__pycache__")
TESTS = "tests/"

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')
NODE_RE = re.compile(r'^\s*"(node\d+)"\s*\[\s*label\s*=\s*"((?:[^"\\]|\\.)*)"')
EDGE_RE = re.compile(
    r'^\s*"(node\d+)"\s*->\s*"(node\d+)"\s*(?:\[\s*style\s*=\s*(\w+)\s*\])?')
TARGET_RE = re.compile(
    r"^\s*(add_library|add_executable)\s*\(\s*([^\s)]+)(?:\s+(\w+))?",
    re.MULTILINE)

CUDA_HEADERS = re.compile(r"^(cuda|cublas|curand|cufft|cusparse|nvrtc|"
                          r"nvToolsExt|thrust/|cub/|cooperative_groups)")
# External include -> the package whose targets provide it: a prefix of the
# include path, or a regex, then a prefix of the providing targets' names.
PACKAGES = (
    ("absl/", "absl::"),
    ("grpcpp/", "gRPC::"),
    ("grpc/", "gRPC::"),
    ("grpc++/", "gRPC::"),
    ("google/protobuf/", "protobuf::"),
    ("prometheus/", "prometheus-cpp::"),
    ("nlohmann/", "nlohmann_json::"),
    ("CLI/", "CLI11::"),
    ("benchmark/", "benchmark::"),
    ("gtest/", "GTest::"),
    ("gmock/", "GTest::"),
    ("xxhash.h", "PkgConfig::XXHASH"),
    ("zmq.hpp", "cppzmq"),
    ("zmq_addon.hpp", "cppzmq"),
    ("systemd/", "PkgConfig::SYSTEMD"),
    (CUDA_HEADERS, "CUDA::"),
)
C_STD_HEADERS = {
    "assert.h", "ctype.h", "errno.h", "float.h", "inttypes.h", "limits.h",
    "math.h", "stdarg.h", "stdbool.h", "stddef.h", "stdint.h", "stdio.h",
    "stdlib.h", "string.h", "time.h",
}


def _starts(include, prefixes):
    return any(include.startswith(p) for p in prefixes)


def _std_header(include):
    return re.fullmatch(r"[a-z_]+", include) is not None or \
        include in C_STD_HEADERS


# (folder, predicate(include) -> True if forbidden, rule text)
RULES = (
    ("radix",
     lambda inc: _starts(inc, ("grpc/", "grpcpp/", "google/protobuf/",
                               "prometheus/")) or
     CUDA_HEADERS.match(inc) is not None,
     "the index knows nothing of gRPC, protobuf, Prometheus or CUDA"),
    ("daemon/tiers",
     lambda inc: _starts(inc, ("grpc/", "grpcpp/", "google/protobuf/",
                               "radixkv/v1/")),
     "the tiers link no gRPC or protobuf"),
    ("base",
     lambda inc: not (_starts(inc, ("absl/", "base/")) or _std_header(inc)),
     "base uses only Abseil and the standard library"),
)


class SetupError(Exception):
    pass


def read_graph(path):
    """Returns (names, edges): node id -> target name, and a list of
    (from, to, scope) with scope PUBLIC, INTERFACE or PRIVATE."""
    names, edges = {}, []
    scopes = {None: "PUBLIC", "solid": "PUBLIC", "dashed": "INTERFACE",
              "dotted": "PRIVATE"}
    with open(path) as f:
        for line in f:
            m = NODE_RE.match(line)
            if m:
                # "name\n(alias)": the target's name is the first line.
                names[m.group(1)] = m.group(2).split("\\n", 1)[0]
                continue
            m = EDGE_RE.match(line)
            if m:
                if m.group(3) not in scopes:
                    raise SetupError(f"{path}: unknown edge style {m.group(3)}")
                edges.append((m.group(1), m.group(2), scopes[m.group(3)]))
    graph = collections.defaultdict(list)
    for a, b, scope in edges:
        if a in names and b in names:
            graph[names[a]].append((names[b], scope))
    if not names:
        raise SetupError(f"{path}: no targets in the graph")
    return set(names.values()), graph


def visible_targets(graph, target):
    """Targets whose headers `target` may include: its direct link
    dependencies and what they pass on through PUBLIC/INTERFACE links."""
    seen = {target}
    queue = [dep for dep, _ in graph.get(target, ())]
    while queue:
        t = queue.pop()
        if t in seen:
            continue
        seen.add(t)
        queue.extend(dep for dep, scope in graph.get(t, ())
                     if scope in ("PUBLIC", "INTERFACE"))
    return seen


def run_graphviz(cmake, build_dir, out_dir):
    dot = os.path.join(out_dir, "radixkv.dot")
    proc = subprocess.run([cmake, f"--graphviz={dot}", build_dir],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if proc.returncode != 0 or not os.path.exists(dot):
        raise SetupError(f"{cmake} --graphviz failed ({proc.returncode}):\n"
                         f"{proc.stdout[-4000:]}")
    return dot


def cache_value(build_dir, key):
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


class Project:
    def __init__(self, source_dir, build_dir, targets, graph):
        self.src = os.path.realpath(source_dir)
        self.build = os.path.realpath(build_dir)
        self.targets = targets
        self.graph = graph
        self.visible = {}
        # source file (abs) -> production targets compiling it
        self.compiled_by = collections.defaultdict(set)
        # folder (abs) -> production targets compiling sources in it
        self.folder_targets = collections.defaultdict(set)
        self.include_dirs = [self.src]
        self.defined = {}  # folder (rel) -> (libraries, all targets)
        self._read_compile_commands()

    def rel(self, path):
        if path.startswith(self.src + os.sep):
            return os.path.relpath(path, self.src)
        return os.path.relpath(path, self.build)

    def _production_dir(self, rel_dir):
        top = rel_dir.split("/", 1)[0]
        return top in PRODUCTION_ROOTS

    def _read_compile_commands(self):
        path = os.path.join(self.build, "compile_commands.json")
        try:
            with open(path) as f:
                commands = json.load(f)
        except (OSError, ValueError) as e:
            raise SetupError(f"{path}: {e} (configure with "
                             "CMAKE_EXPORT_COMPILE_COMMANDS=ON)")
        dirs = []
        for entry in commands:
            args = entry.get("arguments") or shlex.split(entry["command"])
            out = entry.get("output")
            for i, a in enumerate(args):
                if a == "-o" and i + 1 < len(args):
                    out = args[i + 1]
                for flag in ("-I", "-isystem"):
                    if a == flag and i + 1 < len(args):
                        dirs.append(args[i + 1])
                    elif a.startswith(flag) and len(a) > len(flag):
                        dirs.append(a[len(flag):])
            if not out:
                continue
            out = os.path.relpath(os.path.join(entry["directory"], out),
                                  self.build)
            m = re.match(r"((?:[^/]+/)*?)CMakeFiles/([^/]+)\.dir/", out)
            if not m:
                continue
            defined_in = m.group(1).rstrip("/")
            target = m.group(2)
            if not self._production_dir(defined_in):
                continue
            src = os.path.realpath(os.path.join(entry["directory"],
                                                entry["file"]))
            self.compiled_by[src].add(target)
            self.folder_targets[os.path.dirname(src)].add(target)
        if not self.compiled_by:
            raise SetupError(f"{path}: no compile command of a production "
                             "target")
        for d in dirs:
            d = os.path.realpath(os.path.join(self.build, d))
            inside = (d.startswith(self.src + os.sep) or
                      d.startswith(self.build + os.sep) or d == self.src)
            if inside and d not in self.include_dirs and os.path.isdir(d):
                self.include_dirs.append(d)

    def _defined_targets(self, rel_dir):
        if rel_dir not in self.defined:
            libs, all_targets = [], []
            cml = os.path.join(self.src, rel_dir, "CMakeLists.txt")
            if os.path.exists(cml):
                with open(cml) as f:
                    text = re.sub(r"#.*", "", f.read())
                for kind, name, extra in TARGET_RE.findall(text):
                    if extra in ("ALIAS", "IMPORTED"):
                        continue
                    all_targets.append(name)
                    if kind == "add_library":
                        libs.append(name)
            self.defined[rel_dir] = (libs, all_targets)
        return self.defined[rel_dir]

    def source_dir_of(self, path):
        """The repository folder a file stands for (generated files under
        the build tree stand for the folder whose CMakeLists made them)."""
        if path.startswith(self.build + os.sep):
            return os.path.dirname(os.path.relpath(path, self.build))
        return os.path.dirname(os.path.relpath(path, self.src))

    def owner(self, path):
        """The production target a header (or an uncompiled source) belongs
        to; None for a header no target owns; "tests" for tests/."""
        rel = self.rel(path)
        if rel.startswith(TESTS):
            return "tests"
        stem = os.path.splitext(path)[0]
        for ext in SOURCE_EXTS:
            targets = self.compiled_by.get(stem + ext)
            if targets and len(targets) == 1:
                return next(iter(targets))
        here = self.folder_targets.get(os.path.dirname(path), set())
        if len(here) == 1:
            return next(iter(here))
        folder = self.source_dir_of(path)
        while folder:
            libs, all_targets = self._defined_targets(folder)
            if len(libs) == 1:
                return libs[0]
            if len(libs) > 1 or len(all_targets) > 1:
                return None
            if len(all_targets) == 1:
                return all_targets[0]
            folder = os.path.dirname(folder)
        return None

    def including_targets(self, path):
        targets = self.compiled_by.get(path)
        if targets:
            return sorted(targets)
        owner = self.owner(path)
        return [owner] if owner else []

    def resolve(self, include):
        """The project header `include` names, or None for an external one.
        A path under a project folder of the repository that names no file
        (a generated header not yet generated, a header since removed)
        still resolves, so that its folder's owner is known."""
        for d in self.include_dirs:
            p = os.path.join(d, include)
            if os.path.isfile(p):
                return os.path.realpath(p)
        if "/" in include:
            first = include.split("/", 1)[0]
            for d in self.include_dirs:
                in_repo = d == self.src or (d.startswith(self.src + os.sep) and
                                            not d.startswith(self.build))
                if in_repo and os.path.isdir(os.path.join(d, first)) and \
                        not first.startswith("."):
                    return os.path.realpath(os.path.join(d, include))
        return None

    def can_see(self, target, owner):
        if target not in self.visible:
            self.visible[target] = visible_targets(self.graph, target)
        return owner in self.visible[target]

    def package_visible(self, target, prefix):
        if target not in self.visible:
            self.visible[target] = visible_targets(self.graph, target)
        return any(t.startswith(prefix) for t in self.visible[target])


def includes_of(path):
    with open(path, errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE_RE.match(line)
            if m:
                yield lineno, m.group(1) or m.group(2)


def external_package(include):
    for key, prefix in PACKAGES:
        if isinstance(key, str):
            if include == key or (key.endswith("/") and include.startswith(key)):
                return prefix
        elif key.match(include):
            return prefix
    return None


def production_files(source_dir):
    for top in PRODUCTION_ROOTS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(source_dir,
                                                                 top)):
            dirnames[:] = sorted(d for d in dirnames
                                 if not d.startswith(".") and
                                 d not in SKIP_DIRS)
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXTS + HEADER_EXTS):
                    yield os.path.realpath(os.path.join(dirpath, name))


class Checker:
    def __init__(self, project):
        self.p = project
        self.violations = []
        self.includes = 0
        self.walked = set()
        self.packages = {prefix for _, prefix in PACKAGES
                         if any(t.startswith(prefix) for t in project.targets)}

    def report(self, path, lineno, include, owner, target, rule=None):
        where = f"{self.p.rel(path)}:{lineno}: includes {include}"
        if rule:
            line = (f"{where} (owned by {owner}) but {target} must not "
                    f"include it: {rule}")
        else:
            line = f"{where} (owned by {owner}) but {target} does not link {owner}"
        if line not in self.violations:
            self.violations.append(line)

    def check_file(self, path, target, count=True):
        rel = self.p.rel(path)
        for lineno, include in includes_of(path):
            if count:
                self.includes += 1
            for folder, forbidden, rule in RULES:
                if (rel == folder or rel.startswith(folder + "/")) and \
                        forbidden(include):
                    owner = external_package(include) or \
                        self._project_owner(include) or "another package"
                    self.report(path, lineno, include, owner.rstrip(":"),
                                target, rule)
            header = self.p.resolve(include)
            if header is not None:
                owner = self.p.owner(header)
                if owner is None:
                    # A helper header no target owns: its includes are the
                    # including target's.
                    if (header, target) not in self.walked:
                        self.walked.add((header, target))
                        self.check_file(header, target, count=False)
                    continue
                if owner != target and not self.p.can_see(target, owner):
                    self.report(path, lineno, include, owner, target)
                continue
            package = external_package(include)
            if package and package in self.packages and \
                    not self.p.package_visible(target, package):
                self.report(path, lineno, include, package.rstrip(":"), target)

    def _project_owner(self, include):
        header = self.p.resolve(include)
        return self.p.owner(header) if header else None


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--source-dir",
                    default=os.path.dirname(os.path.dirname(
                        os.path.abspath(__file__))))
    ap.add_argument("--graphviz")
    ap.add_argument("--cmake")
    args = ap.parse_args(argv)

    tmp = None
    try:
        dot = args.graphviz
        if not dot:
            cmake = args.cmake or cache_value(args.build_dir, "CMAKE_COMMAND") \
                or "cmake"
            tmp = tempfile.mkdtemp(prefix="check_includes.")
            dot = run_graphviz(cmake, args.build_dir, tmp)
        targets, graph = read_graph(dot)
        project = Project(args.source_dir, args.build_dir, targets, graph)
    except SetupError as e:
        print(f"check_includes: {e}")
        return 2
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    unresolved = []
    for folder in LIBRARY_FOLDERS:
        path = os.path.join(project.src, folder)
        if not os.path.isdir(path):
            continue
        owner = project.owner(os.path.join(path, "_.h"))
        if owner is None or owner not in targets:
            unresolved.append(f"{folder}: no target of this configuration "
                              f"owns it (found {owner})")
    if unresolved:
        print("\n".join(f"check_includes: {u}" for u in unresolved))
        return 2

    checker = Checker(project)
    files = 0
    for path in production_files(project.src):
        built = [t for t in project.including_targets(path) if t in targets]
        files += 1 if built else 0  # others are not built in this configuration
        for target in built:
            checker.check_file(path, target)
    for line in checker.violations:
        print(line)
    print(f"check_includes: {files} files, {checker.includes} includes, "
          f"{len(checker.violations)} violations")
    return 1 if checker.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
