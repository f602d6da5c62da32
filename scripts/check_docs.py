#!/usr/bin/env python3
"""Checks that every repository path the docs cite exists.

Usage: scripts/check_docs.py [--list] [ROOT]
  ROOT    the repository (default: the directory above this script's)
  --list  also print every reference checked, as `ref file:line: reference`

Reads README.md, docs/**/*.md and examples/README.md, and checks the
references below. The records in docs/bench-history/ (all but its
README.md) are kept as they were written and are not read.

- markdown links and images to relative targets, `[text](path)` and
  reference definitions `[id]: path`: the file or directory exists
  (relative to the document), and a `#anchor` names a heading of the
  target (GitHub's slugs) or an explicit `id`/`name`; `#L12` on a non-
  markdown file is a line number;
- paths in inline code (`daemon/core/cache.cc`, `tests/python/`, a command's
  `bench/replay/replay_matrix.sh build`): every token that starts with a
  top-level directory of the repository (base, bench, client, cmake,
  daemon, deploy, docs, examples, gpu, proto, python, radix, requirements,
  scripts, tests, worker)
  and a `/`, and a code span that is exactly a root file (README.md,
  CMakeLists.txt, CMakePresets.json);
- paths in plain text and in fenced code blocks, the same tokens, but only
  those naming a file with an extension (`docs/TIERS.md`,
  `scripts/gpu_check.sh`), so that words such as "client/server" are never
  taken for paths;
- a `:N` or `:N-M` after a path (`daemon/core/cache.cc:123`): the file has at
  least that many lines.

Not checked: URLs, absolute paths (/tmp/...), paths under build/, paths
preceded by another directory (`build/default/bench/...`, `OLD/daemon/...`,
another repository's `llm-d-kv-cache/docs/configuration.md`)
and tokens with placeholders (`*`, `<`, `$`, `{`, `...`, `…`).

Prints each broken reference as `file:line: reference: why`, then
`check_docs: N references in M files, K broken`; exits 1 if K > 0.
Standard library only.
"""

import os
import re
import sys
import urllib.parse

TOP_DIRS = ("base", "bench", "client", "cmake", "daemon", "deploy", "docs",
            "examples", "gpu", "proto", "python", "radix", "requirements",
            "scripts", "tests", "worker")
ROOT_FILES = ("README.md", "CMakeLists.txt", "CMakePresets.json")
SKIP_DIRS = ("docs/bench-history",)

# A repository path: a top-level directory, a slash, then path characters
# (a full stop at the end, as in "see docs/TIERS.md.", is dropped later),
# optionally followed by :N or :N-M. The look-behind keeps paths that
# continue another one (build/default/bench/x, OLD/daemon/radixkvd, /tmp/x,
# ${ROOT}/scripts/x, llm-d-kv-cache/docs/x.md) out.
PATH_RE = re.compile(
    r"(?<![\w./$}~@-])"
    r"((?:" + "|".join(TOP_DIRS) + r")/(?:[\w.+-]+/?)*)"
    r"(?::(\d+)(?:[-–](\d+))?)?")
LINK_RE = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+[\"'(][^)]*)?\)")
REFDEF_RE = re.compile(r"^\s{0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
CODE_SPAN_RE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")
FENCE_RE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING_RE = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID_RE = re.compile(r"<a\s+[^>]*(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
URL_RE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")
EXT_RE = re.compile(r"\.[A-Za-z][A-Za-z0-9]*$")
PLACEHOLDER_RE = re.compile(r"[*?<>{}$…]|\.\.\.")


def github_slug(text):
    """The anchor GitHub gives a heading's text (before de-duplication)."""
    # Inline markup: links keep their text, code and emphasis their content.
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


class Doc:
    """One markdown file: its lines, and which of them are fenced code."""

    def __init__(self, path):
        with open(path, encoding="utf-8", errors="replace") as f:
            self.lines = f.read().split("\n")
        self.fenced = []
        fence = None
        for line in self.lines:
            m = FENCE_RE.match(line)
            if fence is None and m:
                fence = m.group(1)[0] * len(m.group(1))
                self.fenced.append(True)
            elif fence is not None:
                self.fenced.append(True)
                if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                    fence = None
            else:
                self.fenced.append(False)

    def anchors(self):
        seen = {}
        out = set()
        for line, fenced in zip(self.lines, self.fenced):
            for m in HTML_ID_RE.finditer(line):
                out.add(m.group(1))
            if fenced:
                continue
            m = HEADING_RE.match(line)
            if not m:
                continue
            slug = github_slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else "%s-%d" % (slug, n))
        return out


class Checker:

    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.docs = {}
        self.line_counts = {}
        self.refs = 0
        self.broken = []
        self.listing = None  # a list: every reference checked, for --list

    def doc(self, path):
        if path not in self.docs:
            self.docs[path] = Doc(path)
        return self.docs[path]

    def line_count(self, path):
        if path not in self.line_counts:
            with open(path, "rb") as f:
                data = f.read()
            n = data.count(b"\n")
            if data and not data.endswith(b"\n"):
                n += 1
            self.line_counts[path] = n
        return self.line_counts[path]

    def rel(self, path):
        return os.path.relpath(path, self.root)

    def report(self, doc_path, lineno, ref, why):
        self.broken.append("%s:%d: %s: %s" % (self.rel(doc_path), lineno, ref, why))

    def check_target(self, doc_path, lineno, ref, target, line=None, line_end=None,
                     anchor=None):
        """Checks one resolved target; `ref` is the text as cited."""
        self.refs += 1
        if self.listing is not None:
            self.listing.append("%s:%d: %s" % (self.rel(doc_path), lineno, ref))
        inside = os.path.realpath(target)
        if not (inside == self.root or inside.startswith(self.root + os.sep)):
            self.report(doc_path, lineno, ref, "outside the repository")
            return
        if not os.path.exists(target):
            self.report(doc_path, lineno, ref, "no such file or directory")
            return
        last = max(n for n in (line, line_end) if n is not None) if (line or line_end) else None
        if last is not None:
            if os.path.isdir(target):
                self.report(doc_path, lineno, ref, "a directory has no line %d" % last)
                return
            have = self.line_count(target)
            if last > have:
                self.report(doc_path, lineno, ref,
                            "line %d cited, the file has %d lines" % (last, have))
                return
        if anchor:
            if not target.endswith(".md") or os.path.isdir(target):
                self.report(doc_path, lineno, ref, "anchor #%s on a file that is not markdown" % anchor)
                return
            if anchor not in self.doc(target).anchors():
                self.report(doc_path, lineno, ref,
                            "no heading with anchor #%s in %s" % (anchor, self.rel(target)))

    def check_link(self, doc_path, lineno, raw):
        target = raw.strip()
        if target.startswith("<") and target.endswith(">"):
            target = target[1:-1]
        if not target or URL_RE.match(target):
            return  # URL, mailto:, ...
        path, _, anchor = target.partition("#")
        path = urllib.parse.unquote(path)
        anchor = urllib.parse.unquote(anchor)
        if path.startswith("/"):
            return  # absolute: not a repository path
        resolved = os.path.normpath(os.path.join(os.path.dirname(doc_path), path)) if path else doc_path
        rel = os.path.relpath(resolved, self.root)
        if rel == "build" or rel.startswith("build" + os.sep):
            return
        line = None
        m = re.fullmatch(r"L(\d+)(?:-L(\d+))?", anchor)
        if m and not resolved.endswith(".md"):
            self.check_target(doc_path, lineno, target, resolved, int(m.group(1)),
                              int(m.group(2)) if m.group(2) else None)
            return
        self.check_target(doc_path, lineno, target, resolved, line, None, anchor or None)

    def check_paths(self, doc_path, lineno, text, need_ext):
        for m in PATH_RE.finditer(text):
            path = m.group(1)
            end = m.end(1)
            # A placeholder in or right after the path (docs/*.md,
            # bench/..., tests/<name>) makes it a pattern, not a citation.
            rest = text[end:end + 3]
            if PLACEHOLDER_RE.match(rest) or rest.startswith("..") or PLACEHOLDER_RE.search(path):
                continue
            if path.endswith("."):  # a full stop after the path
                path = path.rstrip(".")
            if need_ext and not EXT_RE.search(path.rstrip("/")):
                continue
            line = int(m.group(2)) if m.group(2) else None
            line_end = int(m.group(3)) if m.group(3) else None
            ref = path + text[m.end(1):m.end()]
            self.check_target(doc_path, lineno, ref, os.path.join(self.root, path),
                              line, line_end)

    def check_doc(self, doc_path):
        d = self.doc(doc_path)
        for i, (line, fenced) in enumerate(zip(d.lines, d.fenced), 1):
            if fenced:
                if not FENCE_RE.match(line):
                    self.check_paths(doc_path, i, line, need_ext=True)
                continue
            m = REFDEF_RE.match(line)
            if m:
                self.check_link(doc_path, i, m.group(2))
                continue
            # Links to URLs go first (a path in their text names a file of
            # another repository), then code spans (their contents are not
            # links), then the other links, then what is left as plain text.
            line = LINK_RE.sub(lambda lm: " " if URL_RE.match(lm.group(2).strip("<>")) else lm.group(0), line)
            rest = []
            pos = 0
            for cm in CODE_SPAN_RE.finditer(line):
                rest.append(line[pos:cm.start()])
                pos = cm.end()
                span = cm.group(2).strip()
                root_file = re.fullmatch(r"(%s)(?::(\d+)(?:[-–](\d+))?)?" %
                                         "|".join(re.escape(f) for f in ROOT_FILES), span)
                if root_file:
                    self.check_target(doc_path, i, span, os.path.join(self.root, root_file.group(1)),
                                      int(root_file.group(2)) if root_file.group(2) else None,
                                      int(root_file.group(3)) if root_file.group(3) else None)
                else:
                    self.check_paths(doc_path, i, span, need_ext=False)
                rest.append(" ")
            rest.append(line[pos:])
            text = "".join(rest)
            plain = []
            pos = 0
            for lm in LINK_RE.finditer(text):
                plain.append(text[pos:lm.start()])
                plain.append(" " + lm.group(1) + " ")
                pos = lm.end()
                self.check_link(doc_path, i, lm.group(2))
            plain.append(text[pos:])
            self.check_paths(doc_path, i, "".join(plain), need_ext=True)

    def doc_files(self):
        files = []
        for name in ("README.md", os.path.join("examples", "README.md")):
            p = os.path.join(self.root, name)
            if os.path.isfile(p):
                files.append(p)
        docs = os.path.join(self.root, "docs")
        skip = [os.path.join(self.root, s) for s in SKIP_DIRS]
        for dirpath, dirnames, filenames in os.walk(docs):
            dirnames.sort()
            records = any(dirpath == s or dirpath.startswith(s + os.sep) for s in skip)
            for f in sorted(filenames):
                if f.endswith(".md") and not (records and f != "README.md"):
                    files.append(os.path.join(dirpath, f))
        return files


def main(argv):
    args = argv[1:]
    listing = "--list" in args
    args = [a for a in args if a != "--list"]
    if len(args) > 1 or (args and args[0] in ("-h", "--help")):
        print(__doc__.strip())
        return 0 if args and args[0] in ("-h", "--help") else 2
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    checker = Checker(root)
    if listing:
        checker.listing = []
    files = checker.doc_files()
    for f in files:
        checker.check_doc(f)
    for r in checker.listing or []:
        print("ref " + r)
    for b in checker.broken:
        print(b)
    print("check_docs: %d references in %d files, %d broken"
          % (checker.refs, len(files), len(checker.broken)))
    return 1 if checker.broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
