#!/usr/bin/python3
"""Checks deploy/prometheus/rules.yml beyond what promtool checks.

Usage: check_rules.py RULES_YML RULES_TEST_YML OPERATIONS_MD

- every alert has a severity (critical, warning, info), a summary naming
  {{ $labels.instance }}, a description, and a runbook_url
  "docs/OPERATIONS.md#<anchor>" whose heading exists in OPERATIONS_MD;
- every alert is tested in RULES_TEST_YML both firing (non-empty
  exp_alerts, each with an instance label unless it is the absent() case)
  and quiet (empty exp_alerts);
- every recording rule has a promql_expr_test.
Exit 77 (ctest: Skipped) when python3-yaml is missing.
"""
import re
import sys

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml missing")
    sys.exit(77)

SEVERITIES = {"critical", "warning", "info"}


def github_anchors(markdown):
    """Anchors GitHub derives from the headings of a Markdown text."""
    anchors = set()
    in_fence = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        m = None if in_fence else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            text = re.sub(r"`", "", m.group(1)).strip().lower()
            text = re.sub(r"[^\w\- ]", "", text)
            anchors.add(text.replace(" ", "-"))
    return anchors


def main():
    rules_path, tests_path, ops_path = sys.argv[1:4]
    with open(rules_path) as f:
        groups = yaml.safe_load(f)["groups"]
    with open(tests_path) as f:
        tests = yaml.safe_load(f)["tests"]
    with open(ops_path) as f:
        anchors = github_anchors(f.read())

    errors = []
    alerts, records = [], []
    for g in groups:
        for r in g["rules"]:
            (alerts if "alert" in r else records).append(r)

    fired, quiet, tested_exprs = set(), set(), set()
    for t in tests:
        for a in t.get("alert_rule_test", []):
            exp = a.get("exp_alerts") or []
            (fired if exp else quiet).add(a["alertname"])
            for e in exp:
                labels = e.get("exp_labels", {})
                if "instance" not in labels and "absent" not in str(
                        next((x["expr"] for x in alerts
                              if x["alert"] == a["alertname"]), "")):
                    errors.append(f"{a['alertname']}: a tested alert without instance")
        for p in t.get("promql_expr_test", []):
            tested_exprs.add(p["expr"].strip())

    for r in alerts:
        name = r["alert"]
        sev = r.get("labels", {}).get("severity")
        if sev not in SEVERITIES:
            errors.append(f"{name}: severity {sev!r} not in {sorted(SEVERITIES)}")
        ann = r.get("annotations", {})
        if "{{ $labels.instance }}" not in ann.get("summary", ""):
            errors.append(f"{name}: summary does not name {{{{ $labels.instance }}}}")
        if not ann.get("description"):
            errors.append(f"{name}: no description")
        url = ann.get("runbook_url", "")
        m = re.fullmatch(r"docs/OPERATIONS\.md#([\w-]+)", url)
        if not m:
            errors.append(f"{name}: runbook_url {url!r} is not docs/OPERATIONS.md#<section>")
        elif m.group(1) not in anchors:
            errors.append(f"{name}: no section #{m.group(1)} in {ops_path}")
        if name not in fired:
            errors.append(f"{name}: no test in which it fires")
        if name not in quiet:
            errors.append(f"{name}: no test in which it stays quiet")
    for r in records:
        if r["record"] not in tested_exprs:
            errors.append(f"{r['record']}: no promql_expr_test")

    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"OK: {len(alerts)} alerts, {len(records)} recording rules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
