#!/usr/bin/python3
"""Checks deploy/grafana/radixkv-dashboard.json.

Usage: check_dashboard.py DASHBOARD_JSON RULES_YML PROMTOOL

- the JSON parses; panel ids are unique; each panel and target uses the
  ${datasource} variable; each target has a unique refId, an expr and a
  legend that names {{instance}};
- promtool accepts every expr (Grafana variables replaced by values, each
  expr written as a recording rule into a temporary rules file for
  `promtool check rules`);
- every recording rule of RULES_YML appears in the dashboard with the same
  expression, apart from the dashboard's instance filter.
Exit 77 (ctest: Skipped) when python3-yaml is missing.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml missing")
    sys.exit(77)

# Values Grafana substitutes at query time.
VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$instance": ".*",
}
INSTANCE_FILTER = re.compile(r',?instance=~"\$instance"')


def substitute(expr):
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    if "$" in expr:
        raise ValueError(f"unknown variable in {expr!r}")
    return expr


def normalize(expr):
    """Expr without the dashboard's instance filter and without whitespace."""
    expr = INSTANCE_FILTER.sub("", expr).replace("{,", "{").replace("{}", "")
    return re.sub(r"\s+", "", expr)


def main():
    dash_path, rules_path, promtool = sys.argv[1:4]
    with open(dash_path) as f:
        dash = json.load(f)
    with open(rules_path) as f:
        groups = yaml.safe_load(f)["groups"]

    errors = []
    ds_uid = "${datasource}"
    names = [v["name"] for v in dash.get("templating", {}).get("list", [])]
    for needed in ("datasource", "instance"):
        if needed not in names:
            errors.append(f"no template variable {needed}")

    ids, exprs = set(), []
    for p in dash["panels"]:
        pid = p["id"]
        if pid in ids:
            errors.append(f"panel id {pid} twice")
        ids.add(pid)
        if p.get("datasource", {}).get("uid") != ds_uid:
            errors.append(f"panel {pid}: datasource is not {ds_uid}")
        refs = set()
        for t in p.get("targets", []):
            where = f"panel {pid} ({p['title']}) target {t.get('refId')}"
            if t.get("refId") in refs or not t.get("refId"):
                errors.append(f"{where}: missing or repeated refId")
            refs.add(t.get("refId"))
            if t.get("datasource", {}).get("uid", ds_uid) != ds_uid:
                errors.append(f"{where}: datasource is not {ds_uid}")
            if not t.get("expr"):
                errors.append(f"{where}: no expr")
                continue
            if "{{instance}}" not in t.get("legendFormat", ""):
                errors.append(f"{where}: legend does not name {{{{instance}}}}")
            if 'instance=~"$instance"' not in t["expr"]:
                errors.append(f"{where}: expr does not filter on $instance")
            exprs.append((f"dashboard:panel{pid}_{t['refId']}", t["expr"]))

    # promtool parses each expr as a recording rule.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": name, "expr": substitute(e)} for name, e in exprs]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(rules, f)
        tmp = f.name
    try:
        r = subprocess.run([promtool, "check", "rules", tmp],
                           capture_output=True, text=True)
    finally:
        os.unlink(tmp)
    if r.returncode != 0:
        errors.append("promtool check rules on the dashboard's exprs:\n"
                      + r.stdout + r.stderr)

    shown = {normalize(e) for _, e in exprs}
    for g in groups:
        for rule in g["rules"]:
            if "record" in rule and normalize(rule["expr"]) not in shown:
                errors.append(f"recording rule {rule['record']}: no panel with "
                              f"its expression {rule['expr'].strip()!r}")

    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"OK: {len(ids)} panels, {len(exprs)} exprs accepted by promtool")
    return 0


if __name__ == "__main__":
    sys.exit(main())
