"""k8s_validate.py on broken copies of the manifests: the unbroken copy
passes, and each copy with one edit below fails (exit 1) with a FAIL line
that names the problem.

Usage: PYTHON tests/deploy/k8s_validate_broken_test.py MANIFEST_DIR
Exit 77 when k8s_validate.py skips (a package is missing).
"""
import contextlib
import io
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # k8s_validate is imported from the source tree

# (what, file, text, replacement, what the FAIL line must contain)
EDITS = [
    ("a duplicate key", "daemonset.yaml",
     "      terminationGracePeriodSeconds: 60\n",
     "      terminationGracePeriodSeconds: 60\n      terminationGracePeriodSeconds: 90\n",
     "duplicate key 'terminationGracePeriodSeconds'"),
    ("a Service that selects other pods", "service.yaml",
     "  selector:\n    app.kubernetes.io/name: radixkvd\n",
     "  selector:\n    app.kubernetes.io/name: radixkv-worker\n",
     "Service radixkvd-metrics: selector does not match radixkvd's pods"),
    ("a PodMonitor interval that is not a duration", "podmonitor.yaml",
     "interval: 15s", "interval: 15 s",
     "data/spec/podMetricsEndpoints/0/interval: '15 s' does not match"),
    ("another socket path", "configmap.yaml",
     "--socket=/run/radixkv/radixkvd.sock", "--socket=/tmp/radixkvd.sock",
     "--socket must be /run/radixkv/radixkvd.sock"),
    ("tiers.yaml tested against other memory", "patches/tiers.yaml",
     "  path: /spec/template/spec/containers/0/resources/requests/memory\n  value: 1Gi\n",
     "  path: /spec/template/spec/containers/0/resources/requests/memory\n  value: 3Gi\n",
     "patches/tiers.yaml: test /spec/template/spec/containers/0/resources/requests/memory: differs"),
    ("a manifest left out of the kustomization", "kustomization.yaml",
     "  - podmonitor.yaml\n", "",
     "kustomization.yaml: podmonitor.yaml is not among its resources"),
    ("a worker without the radixkv group", "examples/worker-deployment.yaml",
     "supplementalGroups: [10001]", "supplementalGroups: [10003]",
     "Deployment radixkv-worker: workers need supplementalGroups [10001]"),
    ("a workers' namespace that enforces restricted", "examples/worker-deployment.yaml",
     "pod-security.kubernetes.io/enforce: privileged",
     "pod-security.kubernetes.io/enforce: restricted",
     "Deployment radixkv-worker: its namespace must enforce Pod Security privileged"),
    ("a PrometheusRule that drifted from rules.yml", "prometheusrule.yaml",
     "expr: radixkv_invariants_ok == 0", "expr: radixkv_invariants_ok == 1",
     "PrometheusRule radixkvd: spec.groups differ from the groups of"),
    ("a PrometheusRule left out of the kustomization", "kustomization.yaml",
     "  - prometheusrule.yaml\n", "",
     "kustomization.yaml: prometheusrule.yaml is not among its resources"),
]


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run(manifests):
    """k8s_validate.py's main on `manifests` in this process (its schemas
    load once), without kubectl."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            import k8s_validate
            rc = k8s_validate.main([manifests, "--no-kubectl"])
        except SystemExit as e:
            rc = e.code
    if rc == 77:
        print(err.getvalue(), end="")
        sys.exit(77)
    return Result(rc, out.getvalue(), err.getvalue())


def main():
    src = os.path.realpath(sys.argv[1] if len(sys.argv) > 1
                           else os.path.join(HERE, "..", "..", "deploy", "kubernetes"))
    failures = 0
    with tempfile.TemporaryDirectory(prefix="k8s_broken.") as tmp:
        # The rules the PrometheusRule is compared with sit beside every copy
        # (MANIFEST_DIR/../prometheus).
        shutil.copytree(os.path.join(src, "..", "prometheus"), os.path.join(tmp, "prometheus"))
        base = os.path.join(tmp, "kubernetes")
        shutil.copytree(src, base)
        r = run(base)
        if r.returncode != 0:
            print(f"FAIL the unbroken copy does not pass (exit {r.returncode}):\n{r.stderr}")
            return 1
        print("unbroken copy passes")
        for n, (what, rel, old, new, expect) in enumerate(EDITS):
            d = os.path.join(tmp, f"broken{n}")
            shutil.copytree(src, d)
            path = os.path.join(d, rel)
            text = open(path, encoding="utf-8").read()
            if text.count(old) != 1:
                print(f"FAIL {what}: {rel} has {text.count(old)} copies of {old!r}, not 1")
                failures += 1
                continue
            with open(path, "w", encoding="utf-8") as f:
                f.write(text.replace(old, new))
            r = run(d)
            lines = [ln for ln in r.stderr.splitlines() if ln.startswith("FAIL ") and expect in ln]
            if r.returncode != 1 or not lines:
                print(f"FAIL {what}: exit {r.returncode}, no FAIL line with {expect!r}:\n"
                      f"{r.stdout}{r.stderr}")
                failures += 1
            else:
                print(f"rejected, {what}: {lines[0]}")
    print(f"{len(EDITS) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
