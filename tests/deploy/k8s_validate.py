"""Validates every Kubernetes manifest under deploy/kubernetes, strictly.

Schemas (all offline, from the project's virtual environment):
  * Kubernetes objects: the strict JSON schemas that kubernetes-validate
    ships (its newest Kubernetes version). Those schemas come from the
    OpenAPI v2 document and carry no enums, so the API's enumerated values
    of the fields below (API_ENUMS) are added to them.
  * PodMonitor and PrometheusRule (monitoring.coreos.com/v1): the JSON
    schemas of cloudcoil-models-prometheus-operator's models, generated from
    the Prometheus Operator's CRDs, made strict (see operator_schema).
Strict means: wrong types, missing required fields, bad enum values,
values that break a pattern and fields the schema does not declare all
fail, as `kubectl apply --validate=strict` would.

JSON patches under patches/ are applied (RFC 6902: add, replace, remove,
test) to their target and the result is validated too, each alone and as
each commented `patches:` example in kustomization.yaml lists them (in
order, with their inline ops); with kubectl, `kubectl kustomize` renders
the base, the cuda patch and each example, and every rendered object is
validated. Then the deployment's own rules are checked (non-root, no
privilege escalation, read-only root, no capabilities, seccomp, requests
and limits, the workers' namespace (enforce privileged, warn and audit
restricted), no hostIPC, no nvidia.com/gpu claim by the cache, probes on the
socket, the shared socket directory, the worker's group, Service/PodMonitor
selectors, the PrometheusRule's groups equal to deploy/prometheus/rules.yml's
(--rules=PATH; default ../prometheus/rules.yml beside MANIFEST_DIR); with --tier: the pool's page_bytes, a writable hostPath tier
directory chowned by the init container, memory raised by the host tier,
no surge), and negative controls prove that the validator rejects broken
objects and broken uses of patches/tiers.yaml.

Usage: PYTHON tests/deploy/k8s_validate.py [MANIFEST_DIR] [--kubectl=PATH|--no-kubectl]
                                          [--rules=PATH]
Exit 0: all hold; 1: a problem (each printed as FAIL ...); 77: a Python
package is missing (scripts/install_deps.sh installs them).
"""
import copy
import importlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

REQUIRED = [
    # (module, pip requirements as requirements/venv.lock pins them)
    ("yaml", "PyYAML==6.0.4"),
    ("jsonschema", "jsonschema==4.26.0"),
    ("referencing", "referencing==0.37.0"),
    ("kubernetes_validate", "kubernetes-validate==1.37.0"),
    ("cloudcoil.models.prometheus_operator.v1",
     "cloudcoil==0.6.0 and cloudcoil-models-prometheus-operator==0.80.1.0"),
]


def require_modules():
    missing = []
    for module, requirement in REQUIRED:
        try:
            importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{requirement} (import {module}: {e})")
    if missing:
        print(f"k8s_validate: {sys.executable} lacks: " + "; ".join(missing), file=sys.stderr)
        print("k8s_validate: scripts/install_deps.sh installs them into the project's "
              "virtual environment (requirements/venv.lock); skipped", file=sys.stderr)
        sys.exit(77)


require_modules()

import jsonschema  # noqa: E402
import referencing  # noqa: E402
import referencing.jsonschema  # noqa: E402
import yaml  # noqa: E402
from importlib.resources import files  # noqa: E402

import kubernetes_validate.utils as kv_utils  # noqa: E402
from cloudcoil.models.prometheus_operator import v1 as promop_v1  # noqa: E402

errors = []


def fail(where, msg):
    errors.append(f"{where}: {msg}")


# --- YAML ------------------------------------------------------------------

class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a mapping with the same key twice (the API
    server keeps only one of them, silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_all(text):
    return list(yaml.load_all(text, Loader=UniqueKeyLoader))


def load_one(text):
    return yaml.load(text, Loader=UniqueKeyLoader)


# --- schemas ---------------------------------------------------------------

# Enumerated values of fields that the Kubernetes API validates but the
# OpenAPI v2 schemas leave as plain strings: definition -> field -> values
# (Kubernetes API reference, core/v1 and apps/v1). null stays allowed where
# the schema allows it. Every entry must name a field of the schemas.
API_ENUMS = {
    "io.k8s.api.core.v1.HostPathVolumeSource": {
        "type": ["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File",
                 "Socket", "CharDevice", "BlockDevice"],
    },
    "io.k8s.api.core.v1.Container": {
        "imagePullPolicy": ["Always", "Never", "IfNotPresent"],
        "terminationMessagePolicy": ["File", "FallbackToLogsOnError"],
    },
    "io.k8s.api.core.v1.SeccompProfile": {
        "type": ["Localhost", "RuntimeDefault", "Unconfined"],
    },
    "io.k8s.api.core.v1.PodSpec": {
        "restartPolicy": ["Always", "OnFailure", "Never"],
        "dnsPolicy": ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
        "preemptionPolicy": ["Never", "PreemptLowerPriority"],
    },
    "io.k8s.api.core.v1.ContainerPort": {"protocol": ["TCP", "UDP", "SCTP"]},
    "io.k8s.api.core.v1.ServicePort": {"protocol": ["TCP", "UDP", "SCTP"]},
    "io.k8s.api.core.v1.ServiceSpec": {
        "type": ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"],
        "sessionAffinity": ["ClientIP", "None"],
        "externalTrafficPolicy": ["Cluster", "Local"],
        "internalTrafficPolicy": ["Cluster", "Local"],
        "ipFamilyPolicy": ["SingleStack", "PreferDualStack", "RequireDualStack"],
    },
    "io.k8s.api.core.v1.Toleration": {
        "operator": ["Exists", "Equal"],
        "effect": ["NoSchedule", "PreferNoSchedule", "NoExecute"],
    },
    "io.k8s.api.apps.v1.DaemonSetUpdateStrategy": {"type": ["RollingUpdate", "OnDelete"]},
    "io.k8s.api.apps.v1.DeploymentStrategy": {"type": ["Recreate", "RollingUpdate"]},
}


def allows_null(prop):
    t = prop.get("type")
    return t == "null" or (isinstance(t, list) and "null" in t)


class KubernetesSchemas:
    """kubernetes-validate's strict schemas of its newest Kubernetes version,
    with API_ENUMS added; one Draft 2020-12 validator per apiVersion/kind."""

    def __init__(self):
        self.version = kv_utils.latest_version()
        self.dir = files("kubernetes_validate").joinpath(
            "kubernetes-json-schema", f"v{self.version}-local-strict")
        defs = json.loads(self.dir.joinpath("_definitions.json").read_text())
        table = defs["$defs"]
        self.problems = []
        for name, fields in API_ENUMS.items():
            for field, values in fields.items():
                prop = table.get(name, {}).get("properties", {}).get(field)
                if prop is None:
                    self.problems.append(f"API_ENUMS: {name}.{field} is not a field of the "
                                         f"Kubernetes {self.version} schemas")
                    continue
                prop["enum"] = values + ([None] if allows_null(prop) else [])
        self.registry = referencing.Resource.from_contents(defs) @ referencing.Registry()
        self.validators = {}

    def validator(self, api_version, kind):
        key = (api_version, kind)
        if key not in self.validators:
            # apps/v1 -> apps-v1, rbac.authorization.k8s.io/v1 -> rbac-v1, v1 -> v1
            group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
            f = self.dir.joinpath(f"{kind.lower()}-{group_version}.json")
            if not re.fullmatch(r"[A-Za-z0-9.\-/]+", api_version + kind) or not f.is_file():
                self.validators[key] = None
            else:
                schema = json.loads(f.read_text())
                self.validators[key] = jsonschema.Draft202012Validator(
                    schema, registry=self.registry)
        return self.validators[key]


def strict_object_schemas(node):
    """Rewrites a pydantic JSON schema in place as the CRD's strict schema:
    an optional field is absent, not null (the `anyOf [X, null]` pydantic
    writes for Optional becomes X), and an object with declared properties
    and no additionalProperties admits no other field."""
    if isinstance(node, list):
        for x in node:
            strict_object_schemas(x)
        return
    if not isinstance(node, dict):
        return
    any_of = node.get("anyOf")
    if isinstance(any_of, list) and {"type": "null"} in any_of:
        rest = [x for x in any_of if x != {"type": "null"}]
        del node["anyOf"]
        if node.get("default", 0) is None:
            del node["default"]
        if len(rest) == 1:
            node.update(rest[0])
        else:
            node["anyOf"] = rest
    if "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False
    for v in list(node.values()):
        strict_object_schemas(v)


def operator_schema(model):
    schema = model.model_json_schema(by_alias=True, mode="validation")
    strict_object_schemas(schema)
    # The object must say what it is.
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind"})
    return schema


class Validators:
    def __init__(self):
        self.k8s = KubernetesSchemas()
        self.operator = {
            kind: jsonschema.Draft202012Validator(operator_schema(getattr(promop_v1, kind)))
            for kind in ("PodMonitor", "PrometheusRule")}

    def for_object(self, obj):
        if obj.get("apiVersion") == "monitoring.coreos.com/v1" and obj.get("kind") in self.operator:
            return self.operator[obj["kind"]]
        if str(obj.get("apiVersion", "")).startswith("monitoring.coreos.com/"):
            return None
        return self.k8s.validator(str(obj["apiVersion"]), str(obj["kind"]))

    def problems(self, obj):
        """Every schema violation of `obj`, as `data/PATH: message`; None
        when no schema covers its apiVersion and kind."""
        v = self.for_object(obj)
        if v is None:
            return None
        out = []
        for e in sorted(v.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path]):
            path = "".join(f"/{p}" for p in e.absolute_path)
            msg = e.message
            if e.context:
                msg += f" ({jsonschema.exceptions.best_match(e.context).message})"
            out.append(f"data{path}: {msg}")
        return out

    def versions(self):
        return (f"kubernetes-validate {importlib.metadata.version('kubernetes-validate')} "
                f"(Kubernetes {self.k8s.version} schemas), cloudcoil-models-prometheus-operator "
                f"{importlib.metadata.version('cloudcoil.models.prometheus_operator')}")


validators = None


def validate_object(where, obj):
    if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind"):
        fail(where, "not a Kubernetes object (apiVersion and kind)")
        return False
    problems = validators.problems(obj)
    if problems is None:
        fail(where, f"no schema for {obj['apiVersion']} {obj['kind']}")
        return False
    for p in problems:
        fail(where, p)
    return not problems


# --- JSON patch (RFC 6902: add, replace, remove, test) -----------------------

class PatchError(Exception):
    pass


def apply_patch(doc, ops):
    out = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or not isinstance(op.get("path"), str):
            raise PatchError(f"not a JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
        if not parts:
            raise PatchError(f"{kind} {path}: the whole document is not patched here")
        last = parts.pop()
        parent = out
        for p in parts:
            try:
                parent = parent[int(p)] if isinstance(parent, list) else parent[p]
            except (KeyError, IndexError, ValueError, TypeError):
                raise PatchError(f"{kind} {path}: no such parent") from None
        if isinstance(parent, list):
            if last == "-" and kind == "add":
                idx = len(parent)
            elif re.fullmatch(r"0|[1-9][0-9]*", last):
                idx = int(last)
            else:
                raise PatchError(f"{kind} {path}: {last!r} is not an array index")
            present = idx < len(parent)
        elif isinstance(parent, dict):
            idx, present = last, last in parent
        else:
            raise PatchError(f"{kind} {path}: the parent is not an object or array")
        if kind == "add":
            if "value" not in op:
                raise PatchError(f"add {path}: no value")
            if isinstance(parent, list):
                if idx > len(parent):
                    raise PatchError(f"add {path}: index past the end")
                parent.insert(idx, copy.deepcopy(op["value"]))
            else:
                parent[idx] = copy.deepcopy(op["value"])
        elif kind in ("replace", "remove", "test"):
            if not present:
                raise PatchError(f"{kind} {path}: no such member")
            if kind == "test" and parent[idx] != op.get("value"):
                raise PatchError(f"test {path}: differs")
            if kind == "replace":
                parent[idx] = copy.deepcopy(op["value"])
            if kind == "remove":
                del parent[idx]
        else:
            raise PatchError(f"unsupported op {kind}")
    return out


# --- the deployment's own rules ----------------------------------------------

SOCKET = "/run/radixkv/radixkvd.sock"
SOCKET_DIR = "/run/radixkv"


def g(obj, *path):
    """obj[path[0]][path[1]]...; None where a step is missing."""
    for p in path:
        if isinstance(obj, dict):
            obj = obj.get(p)
        elif isinstance(obj, list) and isinstance(p, int) and -len(obj) <= p < len(obj):
            obj = obj[p]
        else:
            return None
    return obj


def lst(v):
    return v if isinstance(v, list) else []


def pod_template(obj):
    if obj.get("kind") in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
        return g(obj, "spec", "template")
    return None


def is_socket_dir_volume(v):
    return g(v, "hostPath", "path") == SOCKET_DIR and g(v, "hostPath", "type") == "DirectoryOrCreate"


def probe_ok(p):
    if not p:
        return False
    if p.get("grpc"):
        return True
    cmd = lst(g(p, "exec", "command"))
    return (bool(cmd) and str(cmd[0]).endswith("radixkvctl") and "health" in cmd
            and f"--endpoint=unix:{SOCKET}" in cmd)


def check_pod(where, spec, is_cache):
    for f in ("hostIPC", "hostPID", "hostNetwork"):
        if spec.get(f):
            fail(where, f"{f} must not be set")
    psc = spec.get("securityContext") or {}
    if g(psc, "seccompProfile", "type") != "RuntimeDefault":
        fail(where, "pod seccompProfile must be RuntimeDefault")
    if psc.get("runAsNonRoot") is not True:
        fail(where, "pod runAsNonRoot must be true")
    volumes = lst(spec.get("volumes"))
    containers = ([(c, True) for c in lst(spec.get("initContainers"))]
                  + [(c, False) for c in lst(spec.get("containers"))])
    for c, init in containers:
        w = f"{where} container {c.get('name')}"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            fail(w, "privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            fail(w, "allowPrivilegeEscalation must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            fail(w, "readOnlyRootFilesystem must be true")
        if "ALL" not in lst(g(sc, "capabilities", "drop")):
            fail(w, "capabilities must drop ALL")
        allowed = ["CHOWN", "FOWNER"] if init else []
        for cap in lst(g(sc, "capabilities", "add")):
            if cap not in allowed:
                fail(w, f"adds capability {cap}")
        run_as_non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        run_as_user = sc.get("runAsUser", psc.get("runAsUser"))
        if not init and run_as_non_root is not True:
            fail(w, "must run as non-root")
        if not init and run_as_user == 0:
            fail(w, "runs as uid 0")
        for kind in ("requests", "limits"):
            for r in ("cpu", "memory"):
                if g(c, "resources", kind, r) is None:
                    fail(w, f"resources.{kind}.{r} missing")
            if is_cache and g(c, "resources", kind, "nvidia.com/gpu") is not None:
                fail(w, f"the cache must not claim nvidia.com/gpu ({kind})")
        mounts_dir = any(
            m.get("mountPath") == SOCKET_DIR
            and any(v.get("name") == m.get("name") and is_socket_dir_volume(v) for v in volumes)
            for m in lst(c.get("volumeMounts")))
        if not mounts_dir:
            fail(w, f"must mount the node's {SOCKET_DIR} (hostPath, DirectoryOrCreate) at {SOCKET_DIR}")
        if is_cache and not init:
            for p in ("readinessProbe", "livenessProbe"):
                if not probe_ok(c.get(p)):
                    fail(w, f"{p} must exec radixkvctl --endpoint=unix:{SOCKET} health "
                            "(or be a gRPC probe)")
    if not any(t.get("key") == "nvidia.com/gpu" for t in lst(spec.get("tolerations"))):
        fail(where, "needs a toleration for the nvidia.com/gpu taint")


def labels_match(selector, labels):
    return all((labels or {}).get(k) == v for k, v in (selector or {}).items())


def container(spec, name):
    return next((c for c in lst(g(spec, "containers")) if c.get("name") == name), None)


def effective_flags(where, objs, cache):
    """The daemon's flags: the ConfigMap's file (--flagfile), then the args
    after it; flag(name) is the value that wins (the last one), or None."""
    tpl = g(cache, "spec", "template") or {}
    main = container(tpl.get("spec"), "radixkvd") or {}
    args = [str(a) for a in lst(main.get("args"))]
    flagfile = next((a[len("--flagfile="):] for a in args if a.startswith("--flagfile=")), None)
    flags = []
    if flagfile:
        mount = next((m for m in lst(main.get("volumeMounts"))
                      if flagfile.startswith(str(m.get("mountPath")) + "/")), None)
        vol = mount and next((v for v in lst(g(tpl, "spec", "volumes"))
                              if v.get("name") == mount.get("name")), None)
        cm = None
        if vol and vol.get("configMap"):
            cm = next((o for o in objs if o.get("kind") == "ConfigMap"
                       and g(o, "metadata", "name") == vol["configMap"].get("name")
                       and g(o, "metadata", "namespace") == g(cache, "metadata", "namespace")), None)
        key = flagfile[len(mount["mountPath"]) + 1:] if mount else None
        text = g(cm, "data", key) if cm and key else None
        if not isinstance(text, str):
            fail(where, f"--flagfile={flagfile} is not a key of a ConfigMap mounted in the pod")
        else:
            flags = [ln.strip() for ln in text.split("\n")
                     if ln.strip() and not ln.strip().startswith("#")]
    flags += [a for a in args if not a.startswith("--flagfile=")]

    def flag(name):
        hits = [f for f in flags if f.startswith(f"--{name}=")]
        return hits[-1].split("=", 1)[1] if hits else None
    return flag


def cache_of(objs):
    return next((o for o in objs if o.get("kind") == "DaemonSet"
                 and g(o, "metadata", "name") == "radixkvd"), None)


def check_prometheus_rule(objs, rules_path):
    """The PrometheusRule carries deploy/prometheus/rules.yml's groups, equal
    once parsed (deploy/prometheus/render.py writes it)."""
    prs = [o for o in objs if o.get("kind") == "PrometheusRule"]
    if not prs:
        fail("deploy/kubernetes", "no PrometheusRule (deploy/prometheus/render.py writes it)")
        return
    if not rules_path or not os.path.isfile(rules_path):
        fail("deploy/kubernetes", f"no rules file {rules_path} to compare the PrometheusRule with")
        return
    rules = load_one(open(rules_path, encoding="utf-8").read())
    for pr in prs:
        if g(pr, "spec", "groups") != g(rules, "groups"):
            fail(f"PrometheusRule {g(pr, 'metadata', 'name')}",
                 f"spec.groups differ from the groups of {rules_path}; "
                 "run deploy/prometheus/render.py")


def check_deployment(objs):
    cache = cache_of(objs)
    if not cache:
        fail("deploy/kubernetes", "no DaemonSet radixkvd")
        return
    where = "DaemonSet radixkvd"
    if not isinstance(g(cache, "spec", "template", "spec"), dict):
        fail(where, "no spec.template.spec")
        return
    tpl = cache["spec"]["template"]
    spec = tpl["spec"]
    check_pod(where, spec, True)
    if not spec.get("nodeSelector"):
        fail(where, "needs a nodeSelector")
    main = container(spec, "radixkvd")
    if not main:
        fail(where, "no container radixkvd")
        return
    inits = lst(spec.get("initContainers"))
    init = inits[0] if inits else None
    init_words = json.dumps(lst(g(init, "command"))) + json.dumps(lst(g(init, "args")))
    if (not init or not any(m.get("mountPath") == SOCKET_DIR for m in lst(init.get("volumeMounts")))
            or not re.search(r"chown 10001:10001", init_words)):
        fail(where, f"an init container must chown {SOCKET_DIR} to 10001:10001")
    run_as = g(main, "securityContext", "runAsUser")
    if run_as is None:
        run_as = g(spec, "securityContext", "runAsUser")
    if run_as != 10001:
        fail(where, "radixkvd must run as uid 10001")
    flag = effective_flags(where, objs, cache)
    if flag("socket") != SOCKET:
        fail(where, f"--socket must be {SOCKET} (the probes' and workers' path)")
    metrics = flag("metrics_listen")
    metrics_port = None
    if metrics is not None and re.fullmatch(r"[0-9]+", metrics.split(":")[-1]):
        metrics_port = int(metrics.split(":")[-1])
    if not (metrics or "").startswith("0.0.0.0:"):
        fail(where, "--metrics_listen must listen on the pod IP (0.0.0.0:PORT)")
    port = next((p for p in lst(main.get("ports")) if metrics_port is not None
                 and p.get("containerPort") == metrics_port), None)
    if not g(port, "name"):
        fail(where, f"no named container port for metrics port {metrics_port}")
    gids = [x for x in (flag("attach_allowed_gids") or "").split(",") if x]
    if "10001" not in gids:
        fail(where, "--attach_allowed_gids must admit group 10001 (radixkv)")

    pod_labels = g(tpl, "metadata", "labels")
    for svc in (o for o in objs if o.get("kind") == "Service"):
        w = f"Service {g(svc, 'metadata', 'name')}"
        if not labels_match(g(svc, "spec", "selector"), pod_labels):
            fail(w, "selector does not match radixkvd's pods")
        for p in lst(g(svc, "spec", "ports")):
            tp = p.get("targetPort")
            if isinstance(tp, str) and tp != g(port, "name"):
                fail(w, f"targetPort {tp} is not a radixkvd port")
    for pm in (o for o in objs if o.get("kind") == "PodMonitor"):
        w = f"PodMonitor {g(pm, 'metadata', 'name')}"
        if not labels_match(g(pm, "spec", "selector", "matchLabels"), pod_labels):
            fail(w, "selector does not match radixkvd's pods")
        for e in lst(g(pm, "spec", "podMetricsEndpoints")):
            if e.get("port") != g(port, "name"):
                fail(w, f"port {e.get('port')} is not radixkvd's metrics port")
    if (not any(o.get("kind") == "Service" for o in objs)
            or not any(o.get("kind") == "PodMonitor" for o in objs)):
        fail("deploy/kubernetes", "needs a metrics Service and a PodMonitor")

    # Workers: any other pod that mounts the socket directory.
    workers = [o for o in objs if o is not cache and pod_template(o)
               and any(is_socket_dir_volume(v) for v in lst(g(pod_template(o), "spec", "volumes")))]
    if not workers:
        fail("deploy/kubernetes", "no example worker sharing the socket directory")
    for wk in workers:
        ww = f"{wk['kind']} {g(wk, 'metadata', 'name')}"
        wspec = pod_template(wk)["spec"]
        check_pod(ww, wspec, False)
        if 10001 not in lst(g(wspec, "securityContext", "supplementalGroups")):
            fail(ww, "workers need supplementalGroups [10001] (radixkv) to reach the sockets")
        if g(wspec, "securityContext", "runAsUser") == 10001:
            fail(ww, "run workers as their own uid, not the daemon's")
        # Its namespace admits the hostPath (enforce privileged) and reports
        # every other step away from restricted (warn, audit).
        ns = next((o for o in objs if o.get("kind") == "Namespace"
                   and g(o, "metadata", "name") == g(wk, "metadata", "namespace")), None)
        if ns is None:
            fail(ww, f"its namespace {g(wk, 'metadata', 'namespace')} is not among the manifests")
        else:
            labels = g(ns, "metadata", "labels") or {}
            if labels.get("pod-security.kubernetes.io/enforce") != "privileged":
                fail(ww, "its namespace must enforce Pod Security privileged "
                         "(baseline and restricted refuse the hostPath)")
            for mode in ("warn", "audit"):
                if labels.get(f"pod-security.kubernetes.io/{mode}") != "restricted":
                    fail(ww, f"its namespace must {mode} at Pod Security restricted")


# --- tiers below the pool (--tier, docs/TIERS.md) -----------------------------

def bytes_of(q):
    """Bytes of a Kubernetes memory quantity (1Gi, 512Mi, 1G, 1e9) or of a
    radixkvd size (8GiB, 2MiB, 4096); None when it is neither."""
    m = re.fullmatch(r"([0-9.]+(?:e[0-9]+)?)\s*([KMGTP]i?B?|k|B)?", "" if q is None else str(q))
    if not m:
        return None
    try:
        number = float(m.group(1))
    except ValueError:
        return None
    suffix = m.group(2) or ""
    unit = suffix[:-1] if suffix.endswith("B") else suffix
    power = {"": 0, "K": 1, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5}[unit.rstrip("i")]
    base = 1024 if unit.endswith("i") or suffix.endswith("B") else 1000
    return number * base ** power


def check_tiers(where, objs, cache, base_cache):
    """The daemon of `cache` (DaemonSet radixkvd, its ConfigMap in `objs`)
    has tiers: the pool fixes its page_bytes; the disk tier's directory is
    a hostPath mounted writable, handed to uid 10001 by the init container;
    the container's memory request and limit exceed `base_cache`'s by the
    host tier's bytes; no surge puts two daemons on one tier file. Returns
    whether --tier is set."""
    if not isinstance(g(cache, "spec", "template", "spec"), dict):
        fail(where, "no spec.template.spec")
        return False
    flag = effective_flags(where, objs, cache)
    tier_flag = flag("tier")
    if not tier_flag:
        return False
    pool = flag("pool") or ""
    if not re.match(r"(host|cuda),", pool) or not re.search(r"(^|,)page_bytes=", pool):
        fail(where, f"--tier needs a host or cuda --pool with page_bytes= "
                    f"(the --pool that wins is \"{pool}\")")
    spec = cache["spec"]["template"]["spec"]
    main = container(spec, "radixkvd") or {}
    inits = lst(spec.get("initContainers"))
    init = inits[0] if inits else {}
    host_bytes = 0
    for t in tier_flag.split(";"):
        kind, *kv = t.split(",")
        opt = {x.split("=", 1)[0]: (x.split("=", 1)[1] if "=" in x else "") for x in kv}
        size = bytes_of(opt.get("bytes"))
        if not (size is not None and size > 0):
            fail(where, f"--tier {kind}: bytes={opt.get('bytes')} is not a size")
        if kind == "host":
            host_bytes = size or 0
            continue
        if kind != "disk":
            fail(where, f"--tier: unknown kind {kind}")
            continue
        d = opt.get("path", "")
        mount = next((m for m in lst(main.get("volumeMounts"))
                      if d == m.get("mountPath") or d.startswith(f"{m.get('mountPath')}/")), None)
        vol = mount and next((v for v in lst(spec.get("volumes"))
                              if v.get("name") == mount.get("name")), None)
        if not mount or mount.get("readOnly"):
            fail(where, f"the disk tier's {d} is not on a writable volume mount")
        elif not g(vol, "hostPath") or g(vol, "hostPath", "type") not in ("Directory", "DirectoryOrCreate"):
            fail(where, f"the disk tier's volume {mount.get('name')} must be a hostPath directory "
                        "(the file outlives the pod)")
        init_mount = vol and next((m for m in lst(init.get("volumeMounts"))
                                   if m.get("name") == vol.get("name")), None)
        init_cmd = " ".join(str(x) for x in lst(init.get("command")) + lst(init.get("args")))
        chowned = bool(init_mount) and any(
            (lambda words: len(words) > 1 and words[0] == "chown" and words[1] == "10001:10001"
             and init_mount.get("mountPath") in words[2:])(part.split())
            for part in init_cmd.split("&&"))
        if not chowned:
            fail(where, "the init container must mount the disk tier's volume and chown it to 10001:10001")
    base_main = container(g(base_cache, "spec", "template", "spec"), "radixkvd") or {}
    for kind in ("requests", "limits"):
        have = bytes_of(g(main, "resources", kind, "memory"))
        base = bytes_of(g(base_main, "resources", kind, "memory"))
        need = None if base is None else base + host_bytes
        if have is None or need is None or not have >= need:
            fail(where, f"resources.{kind}.memory {g(main, 'resources', kind, 'memory')} is below "
                        f"{g(base_main, 'resources', kind, 'memory')} plus the host tier's "
                        f"{host_bytes:.0f} bytes")
    surge = g(cache, "spec", "updateStrategy", "rollingUpdate", "maxSurge")
    if surge is not None and surge != 0 and surge != "0%":
        fail(where, "maxSurge would start a second daemon on the node's tier file "
                    "(one daemon per directory)")
    return True


# --- kustomization.yaml's commented `patches:` examples ----------------------

def write_examples(manifests, tmp):
    """Each commented `patches:` block of kustomization.yaml (a block starts
    at "#   patches:" and goes on while its lines are indented further)
    becomes an overlay directory of the manifests, with patch paths
    relative to it. Returns the directories, in the file's order."""
    k = os.path.join(manifests, "kustomization.yaml")
    if not os.path.isfile(k):
        return []
    blocks, current = [], None
    for line in open(k, encoding="utf-8").read().split("\n"):
        if line == "#   patches:":
            current = ["patches:"]
            blocks.append(current)
        elif current is not None and line.startswith("#     "):
            current.append(line[4:])
        else:
            current = None
    dirs = []
    for n, block in enumerate(blocks, 1):
        d = os.path.join(tmp, f"example{n}")
        os.mkdir(d)
        rel = os.path.relpath(manifests, d)
        body = "\n".join(block).replace("path: patches/", f"path: {rel}/patches/")
        with open(os.path.join(d, "kustomization.yaml"), "w", encoding="utf-8") as f:
            f.write(f"resources: [{rel}]\n{body}\n")
        dirs.append(d)
    return dirs


def load_example(d):
    k = load_one(open(os.path.join(d, "kustomization.yaml"), encoding="utf-8").read())
    out = []
    for p in lst(k.get("patches")):
        if g(p, "target", "kind") != "DaemonSet" or g(p, "target", "name") != "radixkvd":
            raise PatchError("a patch whose target is not DaemonSet radixkvd")
        if p.get("path"):
            text = open(os.path.normpath(os.path.join(d, p["path"])), encoding="utf-8").read()
            out.append((os.path.basename(p["path"]), load_one(text)))
        else:
            out.append(("inline", load_one(p.get("patch", ""))))
    return out


def render_with_kubectl(kubectl, manifests, examples, tmp):
    """What `kubectl apply -k` would send, with and without the cuda patch,
    and for each example: the rendered files, named after their patches
    (the checks below go by name)."""
    overlay = os.path.join(tmp, "overlay")
    os.mkdir(overlay)
    rel = os.path.relpath(manifests, overlay)
    with open(os.path.join(overlay, "kustomization.yaml"), "w", encoding="utf-8") as f:
        f.write(f"resources: [{rel}]\npatches:\n  - path: {rel}/patches/cuda-pool.yaml\n"
                "    target: {kind: DaemonSet, name: radixkvd}\n")
    jobs = [("kustomize-base.yaml", [manifests]),
            ("kustomize-cuda.yaml", ["--load-restrictor=LoadRestrictionsNone", overlay])]
    for d in examples:
        text = open(os.path.join(d, "kustomization.yaml"), encoding="utf-8").read()
        names = re.findall(r"path: .*/patches/(.*)\.yaml$", text, re.M)
        if re.search(r"^    patch:", text, re.M):
            names.append("inline")
        jobs.append((f"kustomize-{os.path.basename(d)}-{'+'.join(names)}.yaml",
                     ["--load-restrictor=LoadRestrictionsNone", d]))
    rendered = []
    for name, args in jobs:
        out = os.path.join(tmp, name)
        r = subprocess.run([kubectl, "kustomize", *args], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"kubectl kustomize {args[-1]}", r.stderr.strip() or f"exit {r.returncode}")
            continue
        with open(out, "w", encoding="utf-8") as f:
            f.write(r.stdout)
        rendered.append(out)
    return rendered


# --- main -------------------------------------------------------------------

def yaml_files(d):
    out = []
    for root, _, names in os.walk(d):
        out += [os.path.join(root, n) for n in names if re.search(r"\.ya?ml$", n)]
    return sorted(out)


def main(argv):
    global validators
    here = os.path.dirname(os.path.abspath(__file__))
    args = [a for a in argv if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in argv if a.startswith("--"))
    for k in opts:
        if k not in ("kubectl", "no-kubectl", "rules"):
            print(f"k8s_validate: unknown option --{k}", file=sys.stderr)
            return 2
    manifests = os.path.realpath(args[0] if args else os.path.join(here, "..", "..", "deploy", "kubernetes"))
    if not os.path.isdir(manifests):
        print(f"k8s_validate: {manifests} is not a directory", file=sys.stderr)
        return 2
    kubectl = None if "no-kubectl" in opts else (opts.get("kubectl") or shutil.which("kubectl"))
    rules_path = opts.get("rules") or os.path.join(manifests, "..", "prometheus", "rules.yml")
    errors.clear()
    if validators is None:
        validators = Validators()
    errors.extend(validators.k8s.problems)

    objects, patches, kustomizations = [], [], []
    validated = 0
    for path in yaml_files(manifests):
        rel = os.path.relpath(path, manifests)
        text = open(path, encoding="utf-8").read()
        try:
            docs = load_all(text) if not rel.startswith("patches/") else [load_one(text)]
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{rel} line {mark.line + 1}" if mark else rel
            fail(where, "YAML: " + " ".join(str(getattr(e, "problem", None) or e).split()))
            continue
        if rel.startswith("patches/"):
            patches.append((rel, docs[0]))
            continue
        for i, obj in enumerate(docs):
            if obj is None:
                continue
            if isinstance(obj, dict) and obj.get("kind") == "Kustomization":
                kustomizations.append((rel, obj))
                continue
            name = g(obj, "metadata", "name") if isinstance(obj, dict) else None
            kind = obj.get("kind") if isinstance(obj, dict) else None
            if validate_object(f"{rel}#{i} ({kind} {name})", obj):
                validated += 1
            if isinstance(obj, dict):
                objects.append(obj)
    check_deployment(objects)
    check_prometheus_rule(objects, rules_path)

    # A kustomization lists its directory's manifests, each of which exists.
    for rel, k in kustomizations:
        d = rel[:rel.rindex("/") + 1] if "/" in rel else ""
        listed = [d + str(r) for r in lst(k.get("resources"))]
        for r in listed:
            if not os.path.exists(os.path.join(manifests, r)):
                fail(rel, f"resource {r} does not exist")
        siblings = [os.path.relpath(f, manifests) for f in yaml_files(os.path.join(manifests, d))]
        for f in siblings:
            if "/" not in f[len(d):] and f != rel and f not in listed:
                fail(rel, f"{f} is not among its resources")
        for key in k:
            if key not in ("apiVersion", "kind", "metadata", "resources", "patches", "images",
                           "labels", "namespace", "commonAnnotations"):
                fail(rel, f"unexpected key {key}")

    base_cache = cache_of(objects)

    def with_cache(patched):
        return [patched if o is base_cache else o for o in objects]

    for rel, ops in patches:
        if not isinstance(ops, list) or not base_cache:
            fail(rel, "not a JSON patch list, or no DaemonSet radixkvd")
            continue
        try:
            patched = apply_patch(base_cache, ops)
        except PatchError as e:
            fail(rel, str(e))
            continue
        if validate_object(f"{rel} applied to DaemonSet radixkvd", patched):
            validated += 1
        objs = with_cache(patched)
        before = len(errors)
        check_deployment(objs)
        errors[before:] = [f"{rel} applied: {e}" for e in errors[before:]]
        if not check_tiers(f"{rel} applied", objs, patched, base_cache) and "tiers" in rel:
            fail(rel, "sets no --tier")
        if "cuda" in rel:
            spec = g(patched, "spec", "template", "spec") or {}
            c0 = (lst(spec.get("containers")) or [{}])[0]
            if (spec.get("runtimeClassName") != "nvidia"
                    or not any(e.get("name") == "NVIDIA_VISIBLE_DEVICES" and e.get("value") == "all"
                               for e in lst(c0.get("env")))
                    or not any(str(a).startswith("--pool=cuda") for a in lst(c0.get("args")))):
                fail(rel, "a cuda pool needs runtimeClassName nvidia, NVIDIA_VISIBLE_DEVICES=all "
                          "and --pool=cuda,...")

    with tempfile.TemporaryDirectory(prefix="k8s_validate.") as tmp:
        examples = write_examples(manifests, tmp)
        # Each example applied in its order: valid, the deployment's rules
        # hold, the cuda pool wins where cuda-pool.yaml is among them, and
        # tiers.yaml's rules hold where it is.
        tier_examples = set()
        for d in examples:
            try:
                listed = load_example(d)
                patched = base_cache
                for _, ops in listed:
                    patched = apply_patch(patched, ops)
            except (PatchError, OSError, yaml.YAMLError) as e:
                fail(f"kustomization.yaml example {os.path.basename(d)}", str(e))
                continue
            names = [n for n, _ in listed]
            where = f"kustomization.yaml example [{', '.join(names)}]"
            if validate_object(f"{where} applied to DaemonSet radixkvd", patched):
                validated += 1
            objs = with_cache(patched)
            before = len(errors)
            check_deployment(objs)
            errors[before:] = [f"{where}: {e}" for e in errors[before:]]
            cuda = "cuda-pool.yaml" in names
            if cuda and not (effective_flags(where, objs, patched)("pool") or "").startswith("cuda,"):
                fail(where, "the --pool that wins is not the cuda pool")
            if "tiers.yaml" in names:
                if not check_tiers(where, objs, patched, base_cache):
                    fail(where, "sets no --tier")
                tier_examples.add("cuda" if cuda else "alone")
        if any(rel == "patches/tiers.yaml" for rel, _ in patches) and len(tier_examples) != 2:
            fail("kustomization.yaml", "needs `patches:` examples of patches/tiers.yaml alone "
                                       "and after patches/cuda-pool.yaml")

        # kustomize's output: every object valid, none lost.
        rendered_count, rendered_files = 0, []
        if kubectl and os.path.isfile(os.path.join(manifests, "kustomization.yaml")):
            rendered_files = render_with_kubectl(kubectl, manifests, examples, tmp)
        rendered_base = None
        for path in rendered_files:
            name = os.path.basename(path)
            objs = [o for o in yaml.safe_load_all(open(path, encoding="utf-8").read()) if o]
            for obj in objs:
                if validate_object(f"kustomize {name} ({obj.get('kind')} {g(obj, 'metadata', 'name')})", obj):
                    rendered_count += 1
            kinds = ",".join(sorted(str(o.get("kind")) for o in objs))
            if kinds != "ConfigMap,DaemonSet,Namespace,PodMonitor,PrometheusRule,Service":
                fail(name, f"renders {kinds}")
            rds = cache_of(objs)
            if "cuda" in name and g(rds, "spec", "template", "spec", "runtimeClassName") != "nvidia":
                fail(name, "the cuda patch was not applied")
            if name == "kustomize-base.yaml":
                rendered_base = rds
            if not rds:
                continue
            if "cuda" in name and not (effective_flags(name, objs, rds)("pool") or "").startswith("cuda,"):
                fail(name, "the --pool that wins is not the cuda pool")
            if "tiers" in name and not check_tiers(f"kustomize {name}", objs, rds,
                                                   rendered_base or base_cache):
                fail(name, "the tiers patch was not applied")

    # Negative controls: each broken copy must fail schema validation.
    ds = next((o for o in objects if o.get("kind") == "DaemonSet"), None)
    pm = next((o for o in objects if o.get("kind") == "PodMonitor"), None)
    pr = next((o for o in objects if o.get("kind") == "PrometheusRule"), None)

    def set_in(path, value):
        def mutate(o):
            parent = o
            for p in path[:-1]:
                parent = parent[p]
            parent[path[-1]] = value
        return mutate

    def delete_in(path):
        def mutate(o):
            parent = o
            for p in path[:-1]:
                parent = parent[p]
            del parent[path[-1]]
        return mutate

    pod = ["spec", "template", "spec"]
    endpoint = ["spec", "podMetricsEndpoints", 0]
    broken = [
        ("an unknown container field", ds, set_in(pod + ["containers", 0, "securityContxt"], {})),
        ("a string where an integer belongs", ds, set_in(pod + ["terminationGracePeriodSeconds"], "30")),
        ("a missing required field", ds, delete_in(["spec", "selector"])),
        ("a bad enum value", ds, set_in(pod + ["volumes", 0, "hostPath", "type"], "DirOrCreate")),
        ("a bad seccomp profile type", ds, set_in(pod + ["securityContext", "seccompProfile", "type"],
                                                  "runtimeDefault")),
        ("an unknown PodMonitor field", pm, set_in(endpoint + ["portt"], "metrics")),
        ("a PodMonitor interval that is not a duration", pm, set_in(endpoint + ["interval"], "15 seconds")),
        ("a PodMonitor without its required selector", pm, delete_in(["spec", "selector"])),
        ("a PodMonitor field of the wrong type", pm, set_in(endpoint + ["honorLabels"], "yes")),
        ("an unknown PodMonitor metadata field", pm, set_in(["metadata", "labelz"], {})),
        ("an unknown PrometheusRule rule field", pr,
         set_in(["spec", "groups", 1, "rules", 0, "exprr"], "up == 0")),
        ("a PrometheusRule `for` that is not a duration", pr,
         set_in(["spec", "groups", 1, "rules", 0, "for"], "1 minute")),
        ("a PrometheusRule rule without its required expr", pr,
         delete_in(["spec", "groups", 1, "rules", 0, "expr"])),
        ("a PrometheusRule group without its required name", pr,
         delete_in(["spec", "groups", 0, "name"])),
        ("a PrometheusRule annotation that is not a string", pr,
         set_in(["spec", "groups", 1, "rules", 0, "annotations", "runbook_url"], ["x"])),
    ]
    controls = 0
    for what, base, mutate in broken:
        if base is None:
            fail("negative control", f"{what}: no object to break")
            continue
        broken_copy = copy.deepcopy(base)
        mutate(broken_copy)
        problems = validators.problems(broken_copy)
        if not problems:
            fail("negative control", f"{what} was accepted")
        else:
            controls += 1
            print(f"negative control rejected, {what}: {problems[0]}")

    # ... and each broken use of patches/tiers.yaml must break a tier rule.
    ops_of = dict(patches)
    tiers_ops = ops_of.get("patches/tiers.yaml")
    cuda_ops = ops_of.get("patches/cuda-pool.yaml")
    main_mounts = "/spec/template/spec/containers/0/volumeMounts/-"
    broken_tiers = []
    if isinstance(tiers_ops, list) and base_cache:
        broken_tiers = [
            ("tiers.yaml without raising the memory",
             [o for o in tiers_ops if o["op"] == "test" or "/resources/" not in o["path"]]),
            ("tiers.yaml without chowning the tier directory",
             [o for o in tiers_ops
              if not (o["op"] == "replace" and o["path"].endswith("/initContainers/0/command"))]),
            ("tiers.yaml with the tier directory mounted read-only",
             [dict(o, value=dict(o["value"], readOnly=True)) if o["path"] == main_mounts else o
              for o in tiers_ops]),
            ("tiers.yaml with a surge of new pods",
             tiers_ops + [{"op": "add", "path": "/spec/updateStrategy/rollingUpdate/maxSurge", "value": 1}]),
        ]
        if isinstance(cuda_ops, list):
            broken_tiers.append(("cuda-pool.yaml, then tiers.yaml: a cuda pool without page_bytes",
                                 cuda_ops + tiers_ops))
    elif tiers_ops is not None and not isinstance(tiers_ops, list):
        fail("negative control", "patches/tiers.yaml is not a patch list")
    for what, ops in broken_tiers:
        try:
            patched = apply_patch(base_cache, ops)
        except PatchError as e:
            fail("negative control", f"{what}: {e}")
            continue
        before = len(errors)
        check_tiers("negative control", with_cache(patched), patched, base_cache)
        if len(errors) == before:
            fail("negative control", f"{what} was accepted")
        else:
            print(f"negative control rejected, {what}: {errors[before]}")
            del errors[before:]
            controls += 1

    if errors:
        for e in errors:
            print(f"FAIL {e}", file=sys.stderr)
        print(f"k8s_validate: {len(errors)} problem(s)", file=sys.stderr)
        return 1
    print(f"k8s_validate: {validated} objects valid ({validators.versions()}), "
          f"{rendered_count} kustomize-rendered objects valid"
          f"{'' if kubectl else ' (no kubectl)'}, deployment rules hold, "
          f"{controls} negative controls rejected")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
