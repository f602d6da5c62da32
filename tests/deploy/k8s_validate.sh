#!/usr/bin/env bash
# Validates every Kubernetes manifest under deploy/kubernetes against the
# Kubernetes OpenAPI schemas (npm kubernetes-models; the PodMonitor against
# the Prometheus Operator CRD's schema, npm @kubernetes-models/prometheus-operator),
# strictly: wrong types, missing required fields, bad enum values and fields
# the schema does not know all fail. JSON patches under patches/ are applied
# to their target and the result is validated too, each alone and as each
# commented `patches:` example in kustomization.yaml lists them (in order,
# with their inline ops); with kubectl, `kubectl kustomize` renders the base,
# the cuda patch and each example. Then the deployment's own rules are
# checked (non-root, no privilege escalation, read-only root, no
# capabilities, seccomp, requests and limits, no hostIPC, no nvidia.com/gpu
# claim by the cache, probes on the socket, the shared socket directory, the
# worker's group, Service/PodMonitor selectors; with --tier: the pool's
# page_bytes, a writable hostPath tier directory chowned by the init
# container, memory raised by the host tier, no surge), and negative
# controls prove the validator rejects broken objects.
#
# Usage: tests/deploy/k8s_validate.sh [MANIFEST_DIR]
# The schemas come from scripts/install_deps.sh (npm, under
# /usr/local/lib/radixkv-k8s-schemas, or RADIXKV_K8S_SCHEMAS=DIR); without
# them or without node the test exits 77 (ctest: Skipped).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
manifests=${1:-$here/../../deploy/kubernetes}
manifests=$(cd "$manifests" && pwd)
schemas=${RADIXKV_K8S_SCHEMAS:-/usr/local/lib/radixkv-k8s-schemas}

if ! command -v node >/dev/null 2>&1; then
  echo "k8s_validate: node not found; skipped" >&2
  exit 77
fi
for pkg in kubernetes-models @kubernetes-models/prometheus-operator yaml; do
  if [ ! -f "$schemas/node_modules/$pkg/package.json" ]; then
    echo "k8s_validate: $schemas/node_modules/$pkg missing (scripts/install_deps.sh installs it); skipped" >&2
    exit 77
  fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ln -s "$schemas/node_modules" "$tmp/node_modules"
cat > "$tmp/validate.mjs" <<'EOF'
import { existsSync, readFileSync, readdirSync } from "node:fs";
import { basename, join, relative, resolve } from "node:path";
import { parseAllDocuments, parse } from "yaml";

const root = process.argv[2];
const errors = [];
const fail = (where, msg) => errors.push(`${where}: ${msg}`);

// --- schema validation -----------------------------------------------------

async function modelFor(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/")
    ? apiVersion.split("/") : ["", apiVersion];
  const spec = group === "monitoring.coreos.com"
    ? `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`
    : group === "" ? `kubernetes-models/${version}/${kind}`
    : `kubernetes-models/${group}/${version}/${kind}`;
  try {
    const mod = await import(spec);
    return mod[kind] ?? null;
  } catch {
    return null;
  }
}

// Runs the model's compiled schema validator on a proxy of `obj` that
// records which properties the validator looked up. A property it never
// looked up, in an object whose keys it never listed (a map's are), is a
// field the schema does not define: an error, as `kubectl --validate=strict`.
function strictValidate(Model, obj) {
  const read = new WeakMap();
  const listed = new WeakSet();
  const proxies = new WeakMap();
  const note = (t, k) => {
    if (typeof k !== "string") return;
    if (!read.has(t)) read.set(t, new Set());
    read.get(t).add(k);
  };
  const wrap = (v) => {
    if (v === null || typeof v !== "object") return v;
    if (!proxies.has(v)) {
      proxies.set(v, new Proxy(v, {
        get(t, k, r) { note(t, k); return wrap(Reflect.get(t, k, r)); },
        has(t, k) { note(t, k); return Reflect.has(t, k); },
        getOwnPropertyDescriptor(t, k) { note(t, k); return Reflect.getOwnPropertyDescriptor(t, k); },
        ownKeys(t) { listed.add(t); return Reflect.ownKeys(t); },
      }));
    }
    return proxies.get(v);
  };
  const problems = [];
  try {
    Model.prototype.validate.call(wrap(obj));
  } catch (e) {
    problems.push(e.message);
  }
  const walk = (v, path) => {
    if (v === null || typeof v !== "object") return;
    if (Array.isArray(v)) {
      v.forEach((x, i) => walk(x, `${path}/${i}`));
      return;
    }
    for (const k of Object.keys(v)) {
      if (!listed.has(v) && !read.get(v)?.has(k)) {
        problems.push(`data${path}/${k} is not a field of the schema`);
      } else {
        walk(v[k], `${path}/${k}`);
      }
    }
  };
  walk(obj, "");
  return problems;
}

async function validateObject(where, obj) {
  if (!obj || typeof obj !== "object" || !obj.apiVersion || !obj.kind) {
    fail(where, "not a Kubernetes object (apiVersion and kind)");
    return false;
  }
  const Model = await modelFor(obj.apiVersion, obj.kind);
  if (!Model) {
    fail(where, `no schema for ${obj.apiVersion} ${obj.kind}`);
    return false;
  }
  const problems = strictValidate(Model, obj);
  for (const p of problems) fail(where, p);
  return problems.length === 0;
}

// --- JSON patch (RFC 6902: add, replace, remove, test) ----------------------

function applyPatch(doc, ops) {
  const out = structuredClone(doc);
  for (const op of ops) {
    const parts = op.path.split("/").slice(1)
      .map((p) => p.replaceAll("~1", "/").replaceAll("~0", "~"));
    const last = parts.pop();
    let parent = out;
    for (const p of parts) {
      parent = parent?.[Array.isArray(parent) ? Number(p) : p];
      if (parent === undefined) throw new Error(`${op.op} ${op.path}: no such parent`);
    }
    const isArr = Array.isArray(parent);
    const idx = isArr ? (last === "-" ? parent.length : Number(last)) : last;
    if (op.op === "add") {
      if (isArr) parent.splice(idx, 0, op.value); else parent[idx] = op.value;
    } else if (op.op === "replace" || op.op === "remove" || op.op === "test") {
      if (!(idx in parent)) throw new Error(`${op.op} ${op.path}: no such member`);
      if (op.op === "test" && JSON.stringify(parent[idx]) !== JSON.stringify(op.value)) {
        throw new Error(`test ${op.path}: differs`);
      }
      if (op.op === "replace") parent[idx] = op.value;
      if (op.op === "remove") { if (isArr) parent.splice(idx, 1); else delete parent[idx]; }
    } else {
      throw new Error(`unsupported op ${op.op}`);
    }
  }
  return out;
}

// --- the deployment's own rules ---------------------------------------------

const SOCKET = "/run/radixkv/radixkvd.sock";
const SOCKET_DIR = "/run/radixkv";

function podTemplate(obj) {
  return ["DaemonSet", "Deployment", "StatefulSet", "Job"].includes(obj.kind)
    ? obj.spec?.template : null;
}

function isSocketDirVolume(v) {
  return v.hostPath?.path === SOCKET_DIR && v.hostPath?.type === "DirectoryOrCreate";
}

function probeOk(p) {
  if (!p) return false;
  if (p.grpc) return true;
  const cmd = p.exec?.command ?? [];
  return cmd[0]?.endsWith("radixkvctl") && cmd.includes("health") &&
    cmd.some((a) => a === `--endpoint=unix:${SOCKET}`);
}

function checkPod(where, spec, isCache) {
  for (const f of ["hostIPC", "hostPID", "hostNetwork"]) {
    if (spec[f]) fail(where, `${f} must not be set`);
  }
  const psc = spec.securityContext ?? {};
  if (psc.seccompProfile?.type !== "RuntimeDefault") fail(where, "pod seccompProfile must be RuntimeDefault");
  if (psc.runAsNonRoot !== true) fail(where, "pod runAsNonRoot must be true");
  const all = [...(spec.initContainers ?? []).map((c) => [c, true]),
               ...(spec.containers ?? []).map((c) => [c, false])];
  for (const [c, init] of all) {
    const w = `${where} container ${c.name}`;
    const sc = c.securityContext ?? {};
    if (sc.privileged) fail(w, "privileged");
    if (sc.allowPrivilegeEscalation !== false) fail(w, "allowPrivilegeEscalation must be false");
    if (sc.readOnlyRootFilesystem !== true) fail(w, "readOnlyRootFilesystem must be true");
    if (!(sc.capabilities?.drop ?? []).includes("ALL")) fail(w, "capabilities must drop ALL");
    const added = sc.capabilities?.add ?? [];
    const allowed = init ? ["CHOWN", "FOWNER"] : [];
    for (const cap of added) if (!allowed.includes(cap)) fail(w, `adds capability ${cap}`);
    if (!init && (sc.runAsNonRoot ?? psc.runAsNonRoot) !== true) fail(w, "must run as non-root");
    if (!init && (sc.runAsUser ?? psc.runAsUser) === 0) fail(w, "runs as uid 0");
    for (const kind of ["requests", "limits"]) {
      for (const r of ["cpu", "memory"]) {
        if (c.resources?.[kind]?.[r] === undefined) fail(w, `resources.${kind}.${r} missing`);
      }
      if (isCache && c.resources?.[kind]?.["nvidia.com/gpu"] !== undefined) {
        fail(w, `the cache must not claim nvidia.com/gpu (${kind})`);
      }
    }
    const mountsDir = (c.volumeMounts ?? []).some((m) =>
      m.mountPath === SOCKET_DIR &&
      (spec.volumes ?? []).some((v) => v.name === m.name && isSocketDirVolume(v)));
    if (!mountsDir) fail(w, `must mount the node's ${SOCKET_DIR} (hostPath, DirectoryOrCreate) at ${SOCKET_DIR}`);
    if (isCache && !init) {
      for (const p of ["readinessProbe", "livenessProbe"]) {
        if (!probeOk(c[p])) fail(w, `${p} must exec radixkvctl --endpoint=unix:${SOCKET} health (or be a gRPC probe)`);
      }
    }
  }
  if (!(spec.tolerations ?? []).some((t) => t.key === "nvidia.com/gpu")) {
    fail(where, "needs a toleration for the nvidia.com/gpu taint");
  }
}

function labelsMatch(selector, labels) {
  return Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
}

// The daemon's flags: the ConfigMap's file (--flagfile), then the args after
// it; flag(name) is the value that wins (the last one), or undefined.
function effectiveFlags(where, objs, cache) {
  const tpl = cache.spec.template;
  const main = tpl.spec.containers.find((c) => c.name === "radixkvd") ?? {};
  const flagfile = (main.args ?? []).find((a) => a.startsWith("--flagfile="))?.slice(11);
  let flags = [];
  if (flagfile) {
    const mount = (main.volumeMounts ?? []).find((m) => flagfile.startsWith(m.mountPath + "/"));
    const vol = mount && tpl.spec.volumes.find((v) => v.name === mount.name);
    const cm = vol?.configMap && objs.find((o) => o.kind === "ConfigMap" &&
      o.metadata.name === vol.configMap.name && o.metadata.namespace === cache.metadata.namespace);
    const key = flagfile.slice(mount?.mountPath.length + 1);
    if (!cm || cm.data?.[key] === undefined) {
      fail(where, `--flagfile=${flagfile} is not a key of a ConfigMap mounted in the pod`);
    } else {
      flags = cm.data[key].split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
    }
  }
  flags.push(...(main.args ?? []).filter((a) => !a.startsWith("--flagfile=")));
  return (name) => flags.filter((f) => f.startsWith(`--${name}=`)).pop()?.split("=").slice(1).join("=");
}

function checkDeployment(objs) {
  const cache = objs.find((o) => o.kind === "DaemonSet" && o.metadata?.name === "radixkvd");
  if (!cache) { fail("deploy/kubernetes", "no DaemonSet radixkvd"); return; }
  const where = "DaemonSet radixkvd";
  const tpl = cache.spec.template;
  checkPod(where, tpl.spec, true);
  if (!tpl.spec.nodeSelector) fail(where, "needs a nodeSelector");
  const main = tpl.spec.containers.find((c) => c.name === "radixkvd");
  if (!main) { fail(where, "no container radixkvd"); return; }
  const init = (tpl.spec.initContainers ?? [])[0];
  if (!init || !(init.volumeMounts ?? []).some((m) => m.mountPath === SOCKET_DIR) ||
      !/chown 10001:10001/.test(JSON.stringify(init.command ?? []) + JSON.stringify(init.args ?? []))) {
    fail(where, `an init container must chown ${SOCKET_DIR} to 10001:10001`);
  }
  if ((main.securityContext?.runAsUser ?? tpl.spec.securityContext?.runAsUser) !== 10001) {
    fail(where, "radixkvd must run as uid 10001");
  }
  const flag = effectiveFlags(where, objs, cache);
  if (flag("socket") !== SOCKET) fail(where, `--socket must be ${SOCKET} (the probes' and workers' path)`);
  const metrics = flag("metrics_listen");
  const metricsPort = Number(metrics?.split(":").pop());
  if (!metrics?.startsWith("0.0.0.0:")) fail(where, "--metrics_listen must listen on the pod IP (0.0.0.0:PORT)");
  const port = (main.ports ?? []).find((p) => p.containerPort === metricsPort);
  if (!port?.name) fail(where, `no named container port for metrics port ${metricsPort}`);
  const gids = (flag("attach_allowed_gids") ?? "").split(",").filter(Boolean);
  if (!gids.includes("10001")) fail(where, "--attach_allowed_gids must admit group 10001 (radixkv)");

  const podLabels = tpl.metadata.labels;
  for (const svc of objs.filter((o) => o.kind === "Service")) {
    if (!labelsMatch(svc.spec.selector, podLabels)) fail(`Service ${svc.metadata.name}`, "selector does not match radixkvd's pods");
    for (const p of svc.spec.ports) {
      if (typeof p.targetPort === "string" && p.targetPort !== port?.name) fail(`Service ${svc.metadata.name}`, `targetPort ${p.targetPort} is not a radixkvd port`);
    }
  }
  for (const pm of objs.filter((o) => o.kind === "PodMonitor")) {
    const w = `PodMonitor ${pm.metadata.name}`;
    if (!labelsMatch(pm.spec.selector?.matchLabels, podLabels)) fail(w, "selector does not match radixkvd's pods");
    for (const e of pm.spec.podMetricsEndpoints ?? []) {
      if (e.port !== port?.name) fail(w, `port ${e.port} is not radixkvd's metrics port`);
    }
  }
  if (!objs.some((o) => o.kind === "Service") || !objs.some((o) => o.kind === "PodMonitor")) {
    fail("deploy/kubernetes", "needs a metrics Service and a PodMonitor");
  }

  // Workers: any other pod that mounts the socket directory.
  const workers = objs.filter((o) => o !== cache && podTemplate(o) &&
    (podTemplate(o).spec.volumes ?? []).some(isSocketDirVolume));
  if (workers.length === 0) fail("deploy/kubernetes", "no example worker sharing the socket directory");
  for (const w of workers) {
    const ww = `${w.kind} ${w.metadata.name}`;
    const spec = podTemplate(w).spec;
    checkPod(ww, spec, false);
    if (!(spec.securityContext?.supplementalGroups ?? []).includes(10001)) {
      fail(ww, "workers need supplementalGroups [10001] (radixkv) to reach the sockets");
    }
    if (spec.securityContext?.runAsUser === 10001) fail(ww, "run workers as their own uid, not the daemon's");
  }
}

// --- tiers below the pool (--tier, docs/TIERS.md) ----------------------------

// Bytes of a Kubernetes memory quantity (1Gi, 512Mi, 1G, 1e9) or of a
// radixkvd size (8GiB, 2MiB, 4096); NaN when it is neither.
function bytesOf(q) {
  const m = /^([0-9.]+(?:e[0-9]+)?)\s*([KMGTP]i?B?|k|B)?$/.exec(String(q ?? ""));
  if (!m) return NaN;
  const unit = (m[2] ?? "").replace(/B$/, "");
  const pow = { "": 0, K: 1, k: 1, M: 2, G: 3, T: 4, P: 5 }[unit.replace(/i$/, "")];
  const base = unit.endsWith("i") || /B$/.test(m[2] ?? "") ? 1024 : 1000;
  return Number(m[1]) * base ** pow;
}

// The daemon of `cache` (DaemonSet radixkvd, its ConfigMap in `objs`) has
// tiers: the pool fixes its page_bytes; the disk tier's directory is a
// hostPath mounted writable, handed to uid 10001 by the init container; the
// container's memory request and limit exceed `baseCache`'s by the host
// tier's bytes; no surge puts two daemons on one tier file. Returns whether
// --tier is set.
function checkTiers(where, objs, cache, baseCache) {
  const flag = effectiveFlags(where, objs, cache);
  const tierFlag = flag("tier");
  if (!tierFlag) return false;
  const pool = flag("pool") ?? "";
  if (!/^(host|cuda),/.test(pool) || !/(^|,)page_bytes=/.test(pool)) {
    fail(where, `--tier needs a host or cuda --pool with page_bytes= (the --pool that wins is "${pool}")`);
  }
  const spec = cache.spec.template.spec;
  const main = spec.containers.find((c) => c.name === "radixkvd");
  const init = (spec.initContainers ?? [])[0];
  let hostBytes = 0;
  for (const t of tierFlag.split(";")) {
    const [kind, ...kv] = t.split(",");
    const opt = Object.fromEntries(kv.map((x) => [x.split("=")[0], x.split("=").slice(1).join("=")]));
    if (!(bytesOf(opt.bytes) > 0)) fail(where, `--tier ${kind}: bytes=${opt.bytes} is not a size`);
    if (kind === "host") { hostBytes = bytesOf(opt.bytes); continue; }
    if (kind !== "disk") { fail(where, `--tier: unknown kind ${kind}`); continue; }
    const dir = opt.path ?? "";
    const mount = (main.volumeMounts ?? []).find((m) => dir === m.mountPath || dir.startsWith(m.mountPath + "/"));
    const vol = mount && (spec.volumes ?? []).find((v) => v.name === mount.name);
    if (!mount || mount.readOnly) fail(where, `the disk tier's ${dir} is not on a writable volume mount`);
    else if (!vol?.hostPath || !["Directory", "DirectoryOrCreate"].includes(vol.hostPath.type)) {
      fail(where, `the disk tier's volume ${mount.name} must be a hostPath directory (the file outlives the pod)`);
    }
    const initMount = vol && (init?.volumeMounts ?? []).find((m) => m.name === vol.name);
    const initCmd = [...(init?.command ?? []), ...(init?.args ?? [])].join(" ");
    const chowned = initMount && initCmd.split("&&").some((part) => {
      const words = part.trim().split(/\s+/);
      return words[0] === "chown" && words[1] === "10001:10001" && words.slice(2).includes(initMount.mountPath);
    });
    if (!chowned) fail(where, `the init container must mount the disk tier's volume and chown it to 10001:10001`);
  }
  const baseMain = baseCache.spec.template.spec.containers.find((c) => c.name === "radixkvd");
  for (const kind of ["requests", "limits"]) {
    const have = bytesOf(main.resources?.[kind]?.memory);
    const need = bytesOf(baseMain.resources?.[kind]?.memory) + hostBytes;
    if (!(have >= need)) {
      fail(where, `resources.${kind}.memory ${main.resources?.[kind]?.memory} is below ` +
        `${baseMain.resources?.[kind]?.memory} plus the host tier's ${hostBytes} bytes`);
    }
  }
  const surge = cache.spec.updateStrategy?.rollingUpdate?.maxSurge;
  if (surge !== undefined && surge !== 0 && surge !== "0%") {
    fail(where, "maxSurge would start a second daemon on the node's tier file (one daemon per directory)");
  }
  return true;
}

// --- main -----------------------------------------------------------------

function yamlFiles(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? yamlFiles(join(dir, e.name))
    : /\.ya?ml$/.test(e.name) ? [join(dir, e.name)] : []);
}

const objects = [];
const patches = [];
const kustomizations = [];
let validated = 0;
for (const file of yamlFiles(root).sort()) {
  const rel = relative(root, file);
  const text = readFileSync(file, "utf8");
  if (rel.startsWith("patches/")) {
    patches.push([rel, parse(text, { uniqueKeys: true })]);
    continue;
  }
  const docs = parseAllDocuments(text, { uniqueKeys: true });
  for (const [i, doc] of docs.entries()) {
    const where = `${rel}#${i}`;
    if (doc.errors.length) { fail(where, doc.errors.map((e) => e.message).join("; ")); continue; }
    const obj = doc.toJS();
    if (obj === null) continue;
    if (obj.kind === "Kustomization") { kustomizations.push([rel, obj]); continue; }
    if (await validateObject(`${where} (${obj.kind} ${obj.metadata?.name})`, obj)) validated++;
    objects.push(obj);
  }
}
checkDeployment(objects);

// A kustomization lists its directory's manifests, each of which exists.
for (const [rel, k] of kustomizations) {
  const dir = rel.includes("/") ? rel.slice(0, rel.lastIndexOf("/") + 1) : "";
  const listed = (k.resources ?? []).map((r) => dir + r);
  for (const r of listed) {
    if (!existsSync(join(root, r))) fail(rel, `resource ${r} does not exist`);
  }
  const siblings = yamlFiles(join(root, dir)).map((f) => relative(root, f))
    .filter((f) => !f.slice(dir.length).includes("/") && f !== rel);
  for (const f of siblings) {
    if (!listed.includes(f)) fail(rel, `${f} is not among its resources`);
  }
  for (const key of Object.keys(k)) {
    if (!["apiVersion", "kind", "metadata", "resources", "patches", "images", "labels",
          "namespace", "commonAnnotations"].includes(key)) fail(rel, `unexpected key ${key}`);
  }
}

for (const [rel, ops] of patches) {
  const cache = objects.find((o) => o.kind === "DaemonSet" && o.metadata?.name === "radixkvd");
  if (!Array.isArray(ops) || !cache) { fail(rel, "not a JSON patch list, or no DaemonSet radixkvd"); continue; }
  let patched;
  try { patched = applyPatch(cache, ops); } catch (e) { fail(rel, e.message); continue; }
  if (await validateObject(`${rel} applied to DaemonSet radixkvd`, patched)) validated++;
  const withPatched = objects.map((o) => (o === cache ? patched : o));
  const before = errors.length;
  checkDeployment(withPatched);
  for (const e of errors.splice(before)) fail(`${rel} applied`, e);
  if (!checkTiers(`${rel} applied`, withPatched, patched, cache) && /tiers/.test(rel)) {
    fail(rel, "sets no --tier");
  }
  if (/cuda/.test(rel)) {
    const spec = patched.spec.template.spec;
    const env = spec.containers[0].env ?? [];
    if (spec.runtimeClassName !== "nvidia" ||
        !env.some((e) => e.name === "NVIDIA_VISIBLE_DEVICES" && e.value === "all") ||
        !(spec.containers[0].args ?? []).some((a) => a.startsWith("--pool=cuda"))) {
      fail(rel, "a cuda pool needs runtimeClassName nvidia, NVIDIA_VISIBLE_DEVICES=all and --pool=cuda,...");
    }
  }
}

// kustomization.yaml's commented `patches:` examples, each an overlay
// directory (K8S_EXAMPLES, one a line), applied in their order: valid, the
// deployment's rules hold, the cuda pool wins where cuda-pool.yaml is among
// them, and tiers.yaml's rules hold where it is.
const cacheOf = (objs) => objs.find((o) => o.kind === "DaemonSet" && o.metadata?.name === "radixkvd");
const baseCache = cacheOf(objects);
function loadExample(dir) {
  const k = parse(readFileSync(join(dir, "kustomization.yaml"), "utf8"), { uniqueKeys: true });
  return (k.patches ?? []).map((p) => {
    if (p.target?.kind !== "DaemonSet" || p.target?.name !== "radixkvd") {
      throw new Error("a patch whose target is not DaemonSet radixkvd");
    }
    return p.path ? [basename(p.path), parse(readFileSync(resolve(dir, p.path), "utf8"))]
      : ["inline", parse(p.patch)];
  });
}
const tierExamples = new Set();
for (const dir of (process.env.K8S_EXAMPLES ?? "").split("\n").filter(Boolean)) {
  let list, patched;
  try {
    list = loadExample(dir);
    patched = list.reduce((doc, [, ops]) => applyPatch(doc, ops), baseCache);
  } catch (e) {
    fail(`kustomization.yaml example ${basename(dir)}`, e.message);
    continue;
  }
  const names = list.map(([n]) => n);
  const where = `kustomization.yaml example [${names.join(", ")}]`;
  if (await validateObject(`${where} applied to DaemonSet radixkvd`, patched)) validated++;
  const objs = objects.map((o) => (o === baseCache ? patched : o));
  const before = errors.length;
  checkDeployment(objs);
  for (const e of errors.splice(before)) fail(where, e);
  const cuda = names.includes("cuda-pool.yaml");
  if (cuda && !(effectiveFlags(where, objs, patched)("pool") ?? "").startsWith("cuda,")) {
    fail(where, "the --pool that wins is not the cuda pool");
  }
  if (names.includes("tiers.yaml")) {
    if (!checkTiers(where, objs, patched, baseCache)) fail(where, "sets no --tier");
    tierExamples.add(cuda ? "cuda" : "alone");
  }
}
if (patches.some(([rel]) => rel === "patches/tiers.yaml") && tierExamples.size !== 2) {
  fail("kustomization.yaml", "needs `patches:` examples of patches/tiers.yaml alone and after patches/cuda-pool.yaml");
}

// kustomize's output (extra arguments): every object valid, none lost.
let renderedCount = 0;
let renderedBase = null;
for (const file of process.argv.slice(3)) {
  const docs = parseAllDocuments(readFileSync(file, "utf8"));
  const objs = docs.map((d) => d.toJS()).filter(Boolean);
  for (const obj of objs) {
    if (await validateObject(`kustomize ${file.split("/").pop()} (${obj.kind} ${obj.metadata?.name})`, obj)) renderedCount++;
  }
  const kinds = objs.map((o) => o.kind).sort().join(",");
  if (kinds !== "ConfigMap,DaemonSet,Namespace,PodMonitor,Service") fail(file, `renders ${kinds}`);
  if (/cuda/.test(file) && objs.find((o) => o.kind === "DaemonSet")?.spec.template.spec.runtimeClassName !== "nvidia") {
    fail(file, "the cuda patch was not applied");
  }
  const name = basename(file);
  const rds = cacheOf(objs);
  if (name === "kustomize-base.yaml") renderedBase = rds;
  if (!rds) continue;
  if (/cuda/.test(name) && !(effectiveFlags(name, objs, rds)("pool") ?? "").startsWith("cuda,")) {
    fail(file, "the --pool that wins is not the cuda pool");
  }
  if (/tiers/.test(name) && !checkTiers(`kustomize ${name}`, objs, rds, renderedBase ?? baseCache)) {
    fail(file, "the tiers patch was not applied");
  }
}

// Negative controls: each broken copy must fail validation.
const ds = objects.find((o) => o.kind === "DaemonSet");
const pm = objects.find((o) => o.kind === "PodMonitor");
const broken = [
  ["an unknown container field", ds, (o) => { o.spec.template.spec.containers[0].securityContxt = {}; }],
  ["a string where an integer belongs", ds, (o) => { o.spec.template.spec.terminationGracePeriodSeconds = "30"; }],
  ["a missing required field", ds, (o) => { delete o.spec.selector; }],
  ["a bad enum value", ds, (o) => { o.spec.template.spec.volumes[0].hostPath.type = "DirOrCreate"; }],
  ["an unknown PodMonitor field", pm, (o) => { o.spec.podMetricsEndpoints[0].portt = "metrics"; }],
];
let controls = 0;
for (const [what, base, mutate] of broken) {
  if (!base) continue;
  const copy = structuredClone(base);
  mutate(copy);
  const Model = await modelFor(copy.apiVersion, copy.kind);
  if (strictValidate(Model, copy).length === 0) fail("negative control", `${what} was accepted`);
  else controls++;
}
// ... and each broken use of patches/tiers.yaml must break a tier rule.
const opsOf = (rel) => patches.find(([r]) => r === rel)?.[1];
const tiersOps = opsOf("patches/tiers.yaml");
const cudaOps = opsOf("patches/cuda-pool.yaml");
const mainMounts = "/spec/template/spec/containers/0/volumeMounts/-";
const brokenTiers = !tiersOps || !baseCache ? [] : [
  ["tiers.yaml without raising the memory",
   tiersOps.filter((o) => o.op === "test" || !o.path.includes("/resources/"))],
  ["tiers.yaml without chowning the tier directory",
   tiersOps.filter((o) => !(o.op === "replace" && o.path.endsWith("/initContainers/0/command")))],
  ["tiers.yaml with the tier directory mounted read-only",
   tiersOps.map((o) => (o.path === mainMounts ? { ...o, value: { ...o.value, readOnly: true } } : o))],
  ["tiers.yaml with a surge of new pods",
   [...tiersOps, { op: "add", path: "/spec/updateStrategy/rollingUpdate/maxSurge", value: 1 }]],
  ...(cudaOps ? [["cuda-pool.yaml, then tiers.yaml: a cuda pool without page_bytes",
                  [...cudaOps, ...tiersOps]]] : []),
];
for (const [what, ops] of brokenTiers) {
  const patched = applyPatch(baseCache, ops);
  const before = errors.length;
  checkTiers("negative control", objects.map((o) => (o === baseCache ? patched : o)), patched, baseCache);
  if (errors.length === before) fail("negative control", `${what} was accepted`);
  else { errors.splice(before); controls++; }
}

const pkg = (name) => JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;
if (errors.length) {
  for (const e of errors) console.error(`FAIL ${e}`);
  console.error(`k8s_validate: ${errors.length} problem(s)`);
  process.exit(1);
}
console.log(`k8s_validate: ${validated} objects valid (kubernetes-models ${pkg("kubernetes-models")}, ` +
  `prometheus-operator models ${pkg("@kubernetes-models/prometheus-operator")}), ` +
  `${renderedCount} kustomize-rendered objects valid, deployment rules hold, ` +
  `${controls} negative controls rejected`);
EOF
# kustomization.yaml's commented `patches:` examples, each made an overlay
# of the manifests (patch paths relative to it): a block starts at
# "#   patches:" and goes on while its lines are indented further.
examples=()
if [ -f "$manifests/kustomization.yaml" ]; then
  awk -v out="$tmp/example" '
    /^#   patches:$/ { n++; inb = 1; print "patches:" > (out n ".yaml"); next }
    inb && /^#     / { print substr($0, 5) > (out n ".yaml"); next }
    { inb = 0 }' "$manifests/kustomization.yaml"
  for f in "$tmp"/example*.yaml; do
    [ -e "$f" ] || continue
    d=${f%.yaml}
    mkdir "$d"
    rel=$(realpath --relative-to="$d" "$manifests")
    { printf 'resources: [%s]\n' "$rel"; sed "s|path: patches/|path: $rel/patches/|" "$f"; } \
      > "$d/kustomization.yaml"
    examples+=("$d")
  done
fi
export K8S_EXAMPLES
K8S_EXAMPLES=$(printf '%s\n' "${examples[@]}")

# What `kubectl apply -k` would send, with and without the cuda patch, and
# for each example above, when kubectl (with its built-in kustomize) is on
# this machine.
rendered=()
if command -v kubectl >/dev/null 2>&1 && [ -f "$manifests/kustomization.yaml" ]; then
  mkdir "$tmp/overlay"
  rel=$(realpath --relative-to="$tmp/overlay" "$manifests")
  printf 'resources: [%s]\npatches:\n  - path: %s/patches/cuda-pool.yaml\n    target: {kind: DaemonSet, name: radixkvd}\n' \
    "$rel" "$rel" > "$tmp/overlay/kustomization.yaml"
  kubectl kustomize "$manifests" > "$tmp/kustomize-base.yaml"
  kubectl kustomize --load-restrictor=LoadRestrictionsNone "$tmp/overlay" > "$tmp/kustomize-cuda.yaml"
  rendered=("$tmp/kustomize-base.yaml" "$tmp/kustomize-cuda.yaml")
  for d in "${examples[@]}"; do
    # Named after its patches (the validator's checks go by name).
    name=$(sed -n 's|.*path: .*/patches/\(.*\)\.yaml$|\1|p' "$d/kustomization.yaml" | paste -sd+)
    if grep -q '^    patch:' "$d/kustomization.yaml"; then name=$name+inline; fi
    out=$tmp/kustomize-$(basename "$d")-$name.yaml
    kubectl kustomize --load-restrictor=LoadRestrictionsNone "$d" > "$out"
    rendered+=("$out")
  done
fi
node "$tmp/validate.mjs" "$manifests" "${rendered[@]}"
