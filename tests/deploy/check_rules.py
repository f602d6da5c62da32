#!/usr/bin/python3
"""Checks deploy/prometheus/rules.yml beyond what promtool checks.

Usage: check_rules.py RULES_YML RULES_TEST_YML OPERATIONS_MD

- every alert has a severity (critical, warning, info), a summary naming
  {{ $labels.instance }}, a description, and a runbook_url
  "<base>#<anchor>": one absolute http(s) base shared by every alert
  (deploy/prometheus/render.py sets it), and an anchor that is the alert's
  own runbook section, a heading "### <alert name>" under "## Alerts" in
  OPERATIONS_MD;
- every alert has a row "| [<name>](#<anchor>) | <severity> | ... |" in
  OPERATIONS_MD's alert table, with the rule's severity, and every row and
  runbook section there names an alert of the rules (none goes stale);
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


def alerts_section(markdown):
    """The lines of the "## Alerts" section of OPERATIONS.md."""
    lines = markdown.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip() == "## Alerts"), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    return lines[start + 1:end]


def alert_table(section):
    """{alert name: (anchor, severity)} from the rows of the table headed
    "| alert | severity | fires when |"."""
    rows, in_table = {}, False
    for line in section:
        if re.match(r"\|\s*alert\s*\|\s*severity\s*\|", line):
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            break
        m = re.match(r"\|\s*\[(\w+)\]\(#([\w-]+)\)\s*\|\s*(\w+)\s*\|", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def runbook_sections(section):
    """The names of the "### <name>" runbook headings of the section."""
    out, in_fence = [], False
    for line in section:
        if line.startswith("```"):
            in_fence = not in_fence
        m = None if in_fence else re.match(r"###\s+(\S+)\s*$", line)
        if m:
            out.append(m.group(1))
    return out


def main():
    rules_path, tests_path, ops_path = sys.argv[1:4]
    with open(rules_path) as f:
        groups = yaml.safe_load(f)["groups"]
    with open(tests_path) as f:
        tests = yaml.safe_load(f)["tests"]
    with open(ops_path) as f:
        ops = f.read()
    anchors = github_anchors(ops)
    section = alerts_section(ops)
    table = alert_table(section)
    runbooks = runbook_sections(section)

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

    bases = set()
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
        m = re.fullmatch(r"(https?://[^\s#]+)#([\w-]+)", url)
        anchor = github_anchors(f"### {name}").pop()
        if not m:
            errors.append(f"{name}: runbook_url {url!r} is not <absolute base URL>#<section>")
        else:
            bases.add(m.group(1))
            if m.group(2) != anchor:
                errors.append(f"{name}: runbook_url points at #{m.group(2)}, not its own "
                              f"runbook section #{anchor}")
            elif m.group(2) not in anchors:
                errors.append(f"{name}: no section #{m.group(2)} in {ops_path}")
        if name not in runbooks:
            errors.append(f"{name}: no runbook section \"### {name}\" under \"## Alerts\" "
                          f"in {ops_path}")
        if name not in table:
            errors.append(f"{name}: no row in the alert table of {ops_path}")
        else:
            row_anchor, row_sev = table[name]
            if row_anchor != anchor:
                errors.append(f"{name}: its alert-table row links #{row_anchor}, not #{anchor}")
            if row_sev != sev:
                errors.append(f"{name}: its alert-table row says {row_sev}, the rule {sev}")
        if name not in fired:
            errors.append(f"{name}: no test in which it fires")
        if name not in quiet:
            errors.append(f"{name}: no test in which it stays quiet")
    for r in records:
        if r["record"] not in tested_exprs:
            errors.append(f"{r['record']}: no promql_expr_test")
    if len(bases) > 1:
        errors.append("runbook_url bases differ: " + ", ".join(sorted(bases))
                      + " (deploy/prometheus/render.py sets one)")
    names = {r["alert"] for r in alerts}
    for name in sorted(set(table) - names):
        errors.append(f"{name}: a row of the alert table in {ops_path}, but no such alert")
    for name in sorted(set(runbooks) - names):
        errors.append(f"{name}: a runbook section in {ops_path}, but no such alert")

    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"OK: {len(alerts)} alerts, {len(records)} recording rules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
