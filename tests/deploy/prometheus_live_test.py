#!/usr/bin/python3
"""A real Prometheus scraping a real radixkvd, loading deploy/prometheus/rules.yml.

Usage: prometheus_live_test.py PROMETHEUS RADIXKVD RADIXKV_WORKER RULES_YML DASHBOARD_JSON

Starts radixkvd (host pool with a host and a disk tier below it, socket
under /tmp, metrics on a free loopback port), Prometheus (1 s scrape and
rule evaluation, TSDB in a temporary directory, web API on a free loopback
port), runs the reference worker three times on the same text so that the
later runs hit, and then asks the HTTP
API for a rate() of requests, the hit-ratio recording rule (> 0) and a
histogram_quantile() of Acquire durations, checks that every rule
evaluates without error and that every query of the Grafana dashboard
returns data for this daemon. Finishes within DEADLINE_S.
Exit 77 (ctest: Skipped) when PROMETHEUS is not installed.
"""
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

DEADLINE_S = 50
JOB = "radixkvd"


class BadQuery(Exception):
    """Prometheus refused a query (HTTP 400): waiting will not help."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Live:
    def __init__(self, prometheus, radixkvd, worker, rules, dashboard):
        self.prometheus, self.radixkvd = prometheus, radixkvd
        self.worker, self.rules, self.dashboard = worker, rules, dashboard
        self.start = time.monotonic()
        self.work = tempfile.mkdtemp(prefix="rkv_prom.", dir="/tmp")
        self.procs = []
        self.api = None

    def left(self):
        return DEADLINE_S - (time.monotonic() - self.start)

    def wait_for(self, what, probe, step=0.25):
        """Calls probe() until it returns a true value; fails at the deadline."""
        last = None
        while self.left() > 0:
            try:
                value = probe()
                if value:
                    return value
            except BadQuery:
                raise
            except Exception as e:  # not up yet, or not scraped yet
                last = e
            time.sleep(step)
        raise AssertionError(f"timed out waiting for {what} (last error: {last})")

    def spawn(self, name, argv):
        log = open(os.path.join(self.work, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, p))
        return p

    def log(self, name):
        with open(os.path.join(self.work, name + ".log")) as f:
            return f.read()

    def start_daemon(self):
        self.sock = os.path.join(self.work, "d.sock")
        # Tiers export their series (the dashboard's Tiers row) from the
        # start; page_bytes is the tiny model's page size.
        p = self.spawn("radixkvd", [self.radixkvd, f"--socket={self.sock}",
                                    "--metrics_listen=127.0.0.1:0",
                                    "--pool=host,bytes=64MiB,page_bytes=8192",
                                    f"--tier=host,bytes=1MiB;disk,path={self.work},bytes=4MiB"])

        def metrics_addr():
            if p.poll() is not None:
                raise SystemExit(f"radixkvd exited {p.returncode}:\n{self.log('radixkvd')}")
            m = re.search(r"metrics http://(127\.0\.0\.1:\d+)/metrics", self.log("radixkvd"))
            return m and "ready" in self.log("radixkvd") and m.group(1)
        self.target = self.wait_for("radixkvd ready", metrics_addr, 0.05)

    def start_prometheus(self):
        config = os.path.join(self.work, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [{json.dumps(os.path.abspath(self.rules))}]
scrape_configs:
  - job_name: {JOB}
    static_configs: [{{targets: ["{self.target}"]}}]
""")
        for _ in range(3):  # another process may take the free port first
            port = free_port()
            p = self.spawn("prometheus", [
                self.prometheus, f"--config.file={config}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--storage.tsdb.path={os.path.join(self.work, 'tsdb')}",
                "--log.level=warn"])
            self.api = f"http://127.0.0.1:{port}/api/v1/"
            try:
                self.wait_for("prometheus ready",
                              lambda: p.poll() is None and http_get(
                                  f"http://127.0.0.1:{port}/-/ready") is not None)
                return
            except AssertionError:
                if p.poll() is None:
                    raise
        raise SystemExit(f"prometheus did not start:\n{self.log('prometheus')}")

    def query(self, expr):
        """Instant query; returns [(labels, float value)]."""
        url = self.api + "query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as e:
            if e.code == 400:
                raise BadQuery(f"{expr}: {e.read().decode()}") from e
            raise
        assert body["status"] == "success", body
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def positive(self, expr):
        """Waits until expr has a sample for this target with a finite value > 0."""
        def probe():
            got = [(l, v) for l, v in self.query(expr)
                   if math.isfinite(v) and v > 0]
            return got and got
        got = self.wait_for(f"{expr} > 0", probe)
        print(f"{expr} = {got[0][1]:.6g} {got[0][0]}")
        return got

    def run_worker(self, text):
        for i in range(3):
            r = subprocess.run([self.worker, "run", "--model", "tiny", "--decode", "4",
                                "--endpoint", f"unix:{self.sock}", "--text", text],
                               capture_output=True, text=True, timeout=max(self.left(), 1))
            assert r.returncode == 0, f"worker exited {r.returncode}:\n{r.stdout}{r.stderr}"
            print("worker:", r.stdout.strip())
            if i > 0:
                assert "matched=0 " not in r.stdout, "a repeated prompt did not hit"

    def stop(self):
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.work, ignore_errors=True)


def check(live):
    live.start_daemon()
    live.start_prometheus()
    up = f'up{{job="{JOB}"}}'
    live.wait_for("first scrape", lambda: live.query(f"{up} == 1"))
    text = os.path.join(live.work, "prompt.txt")
    with open(text, "w") as f:
        f.write("radixkv caches the key/value blocks of shared prompt prefixes. " * 6 + "\n")
    live.run_worker(text)

    sel = f'job="{JOB}",instance="{live.target}"'
    live.positive(f'sum by (instance) (rate(radixkv_requests_total{{{sel}}}[30s]))')
    hit = live.positive(f'radixkv:hit_ratio:rate5m{{{sel}}}')
    assert hit[0][1] <= 1, hit
    p99 = live.positive('histogram_quantile(0.99, sum by (instance, le) '
                        f'(rate(radixkv_request_duration_seconds_bucket{{{sel},method="Acquire"}}[30s])))')
    assert p99[0][1] <= 10, p99
    # The pinned-fraction recording rule exists once the pool does.
    live.wait_for("radixkv:pinned_fraction",
                  lambda: live.query(f'radixkv:pinned_fraction{{{sel}}} >= 0'))

    # Every rule has been evaluated on real data without an error, and no
    # alert about this healthy daemon is firing.
    def evaluated():
        body = json.loads(http_get(live.api + "rules"))
        rules = [r for g in body["data"]["groups"] for r in g["rules"]]
        bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert not bad, f"rules with errors: {bad}"
        return rules
    rules = live.wait_for("rule evaluation", evaluated)
    print(f"{len(rules)} rules evaluated, all healthy")
    firing = live.query('ALERTS{alertstate="firing"}')
    assert not firing, f"alerts firing on a healthy daemon: {firing}"
    check_dashboard(live)


def check_dashboard(live):
    """Every dashboard query, as Grafana would send it for this daemon."""
    with open(live.dashboard) as f:
        panels = json.load(f)["panels"]
    # Grafana's regex-escaped value, inside a PromQL string literal.
    instance = re.escape(live.target).replace("\\", "\\\\")
    for p in panels:
        for t in p.get("targets", []):
            expr = (t["expr"].replace("$instance", instance)
                    .replace("$__rate_interval", "15s"))
            got = live.wait_for(f"dashboard panel {p['title']!r}: {expr}",
                                lambda: live.query(expr))
            assert all(l.get("instance") == live.target for l, _ in got), got
    print(f"{len(panels)} dashboard panels return data")


def main():
    prometheus, radixkvd, worker, rules, dashboard = sys.argv[1:6]
    if not (os.path.isfile(prometheus) and os.access(prometheus, os.X_OK)):
        found = shutil.which("prometheus")
        if not found:
            print(f"SKIP: prometheus not installed ({prometheus})")
            return 77
        prometheus = found
    live = Live(prometheus, radixkvd, worker, rules, dashboard)
    try:
        check(live)
    except BaseException:
        for name, _ in live.procs:
            print(f"--- {name} log:\n{live.log(name)[-4000:]}", file=sys.stderr)
        raise
    finally:
        live.stop()
    print(f"OK in {time.monotonic() - live.start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
