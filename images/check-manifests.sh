#!/usr/bin/env bash
# Validates the Kubernetes manifests offline: the static pod
# (images/k8s/dpu-service.yaml), the Helm chart (images/helm/dpu-service)
# and the DOCA Platform Framework (DPF) objects (images/dpf).
#
#  - yamllint on the hand-written YAML;
#  - the chart rendered as `helm template` would (images/render-chart: Go's
#    text/template with sprig and Helm's own functions, built from Debian's
#    Go packages, since helm is in none of the registries this machine
#    reaches): under two release names, with a changed configuration, with
#    TLS off, with DPF's values (images/dpf/values-dpf.yaml: serviceID and
#    every serviceDaemonSet field) and with the values DPF hands it for
#    images/dpf's DPUServiceTemplate and DPUServiceConfiguration;
#  - kubernetes-validate --strict against Kubernetes 1.30's schemas for the
#    static pod and every rendered document;
#  - the properties a DPU deployment needs (images/check_manifests.py, then
#    the checks below it): host network, hugepages, Guaranteed QoS with
#    whole CPUs, the device and state mounts, gRPC probes on the health
#    port, exactly five capabilities, one DaemonSet on arm64 nodes, names
#    from the release, checksum/config = sha256 of the rendered ConfigMap,
#    a configuration that parses as TOML;
#  - DPF (images/dpf/check_dpf.py): images/dpf's objects against JSON
#    schemas derived from DPF's CRDs (images/dpf/schemas, python
#    jsonschema); the template's chart, values and resources and the
#    configuration's values and ports consistent with the chart and the
#    DPUServiceInterfaces; each DPF value landed in the rendered DaemonSet
#    (svc.dpu.nvidia.com/service label, node affinity beside the arm64
#    nodeSelector, labels, annotations, updateStrategy), and none of it
#    with the chart's own values;
#  - with DPU_SERVICE_BIN set to a dpu-service binary: the chart's
#    configuration, and the one DPF deploys, pass that binary's
#    --check-config.
# Installs what it needs (Debian's golang and sprig, a Python venv with
# kubernetes-validate, jsonschema and yamllint under target/) and is
# re-runnable.
# Run from anywhere; paths are relative to the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { echo "check-manifests: $*" >&2; }
fail() { echo "check-manifests: FAILED: $*" >&2; exit 1; }

tdir=$(realpath -m "${CARGO_TARGET_DIR:-target}")
work="$tdir/manifests"
mkdir -p "$work"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

need=()
command -v go >/dev/null || need+=(golang-go)
[ -d /usr/share/gocode/src/github.com/Masterminds/sprig ] || need+=(golang-github-masterminds-sprig-dev)
[ -d /usr/share/gocode/src/gopkg.in/yaml.v3 ] || need+=(golang-gopkg-yaml.v3-dev)
# Debian's python3 makes venvs with pip only with python3-venv installed.
python3 -c 'import ensurepip, tomllib' >/dev/null 2>&1 || need+=(python3-venv)
if ((${#need[@]})); then
  step "installing ${need[*]}"
  { "${sudo_cmd[@]}" apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}"; } \
    >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; fail "apt-get install ${need[*]}"; }
fi

venv="$tdir/manifest-venv"
if ! "$venv/bin/python" -c 'import kubernetes_validate, yamllint, yaml, jsonschema' >/dev/null 2>&1; then
  step "making the Python venv $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || fail "python3 -m venv $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate yamllint pyyaml jsonschema >"$work/pip.log" 2>&1 ||
    { cat "$work/pip.log" >&2; rm -rf "$venv"; fail "pip install kubernetes-validate yamllint pyyaml jsonschema"; }
fi

# The renderer: GOPATH mode over Debian's Go sources, no module downloads.
render="$work/render-chart"
(cd images/render-chart && GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off GOFLAGS='' \
  GOCACHE="$work/go-cache" go build -o "$render" .) || fail "building images/render-chart"

chart=images/helm/dpu-service
step "rendering $chart"
printf 'config: |\n  [log]\n  level = "debug"\n' >"$work/other-config.yaml"
printf 'tls:\n  enabled: false\n' >"$work/no-tls.yaml"
"$render" -name dpu "$chart" >"$work/dpu.yaml" || fail "rendering the chart (release dpu)"
"$render" -name edge-dpu-service -namespace dpu-system "$chart" >"$work/edge.yaml" ||
  fail "rendering the chart (release edge-dpu-service)"
# Release "dpu" again with one configuration value changed: its pods must roll.
"$render" -name dpu -values "$work/other-config.yaml" "$chart" >"$work/dpu-other-config.yaml" ||
  fail "rendering the chart with another config"
"$render" -name dpu -values "$work/no-tls.yaml" "$chart" >"$work/dpu-no-tls.yaml" ||
  fail "rendering the chart with tls.enabled=false"
dpf=images/dpf
step "rendering $chart with DPF's values"
"$render" -name dpu -values "$dpf/values-dpf.yaml" "$chart" >"$work/dpu-dpf.yaml" ||
  fail "rendering the chart with $dpf/values-dpf.yaml"
# The values DPF passes for the DPUServiceTemplate and DPUServiceConfiguration
# (merged as a DPUDeployment does), under the template's release name.
dpf_release=$("$venv/bin/python" "$dpf/check_dpf.py" values "$work/dpf-deploy-values.yaml") ||
  fail "merging $dpf's template and configuration values"
"$render" -name "$dpf_release" -namespace dpf-operator-system -values "$work/dpf-deploy-values.yaml" "$chart" \
  >"$work/dpf-deploy.yaml" || fail "rendering the chart with the DPUServiceTemplate's and DPUServiceConfiguration's values"

step "yamllint"
"$venv/bin/yamllint" -s -d '{extends: default, rules: {line-length: {max: 140}, document-start: disable, comments: {min-spaces-from-content: 1}}}' \
  images/k8s/dpu-service.yaml "$chart/values.yaml" "$chart/Chart.yaml" "$dpf"/*.yaml || fail "yamllint"
# The rendered stream: only what templating can break unnoticed by the
# schemas (a key given twice, the last one winning).
"$venv/bin/yamllint" -s -d '{rules: {key-duplicates: enable}}' \
  "$work/dpu.yaml" "$work/edge.yaml" "$work/dpu-other-config.yaml" "$work/dpu-no-tls.yaml" \
  "$work/dpu-dpf.yaml" "$work/dpf-deploy.yaml" || fail "yamllint on the rendered chart"

step "kubernetes-validate --strict (Kubernetes 1.30)"
"$venv/bin/kubernetes-validate" --strict --quiet -k 1.30.0 images/k8s/dpu-service.yaml \
  "$work/dpu.yaml" "$work/edge.yaml" "$work/dpu-other-config.yaml" "$work/dpu-no-tls.yaml" \
  "$work/dpu-dpf.yaml" "$work/dpf-deploy.yaml" ||
  fail "kubernetes-validate: a manifest does not match the Kubernetes 1.30 schemas"

step "DPU properties"
"$venv/bin/python" images/check_manifests.py images/k8s/dpu-service.yaml "$work/dpu.yaml" "$work/edge.yaml" \
  "$work/dpu-other-config.yaml" dpu-service/daemon/config/production.toml "$work/config.toml" ||
  fail "DPU properties (images/check_manifests.py, messages above)"

"$venv/bin/python" - images/k8s/dpu-service.yaml "$work/dpu.yaml" "$work/edge.yaml" "$work/dpu-other-config.yaml" \
  "$work/dpu-no-tls.yaml" <<'PY' || fail "DPU properties (messages above)"
import hashlib, re, sys, tomllib
import yaml

static_path, a_path, b_path, a2_path, notls_path = sys.argv[1:6]
failures = []
def need(ok, what):
    if not ok:
        failures.append(what)

def documents(path):
    """(object, text) per document; text as helm prints it, after # Source."""
    out = []
    for part in re.split(r"^---\n", open(path).read(), flags=re.M):
        if part.strip():
            body = re.sub(r"\A# Source: [^\n]*\n", "", part).strip()
            out.append((yaml.safe_load(body), body))
    return out

def pod_checks(where, spec):
    # Guaranteed QoS needs requests == limits for cpu and memory in every
    # container, init containers included; the service's CPUs are whole.
    for c in spec.get("initContainers", []) + spec["containers"]:
        r = c.get("resources", {})
        req, lim = r.get("requests", {}), r.get("limits", {})
        for k in ("cpu", "memory"):
            need(k in req and str(req[k]) == str(lim.get(k)), f"{where}: {c['name']}: {k} requests = limits")
    [svc] = [c for c in spec["containers"] if c["name"] == "dpu-service"]
    cpu = str(svc["resources"]["requests"].get("cpu", ""))
    need(re.fullmatch(r"[1-9][0-9]*", cpu) is not None, f"{where}: whole CPUs ({cpu!r})")
    hp = {v["name"] for v in spec["volumes"] if v.get("emptyDir", {}).get("medium") == "HugePages"}
    need(any(m["mountPath"] == "/dev/hugepages" and m["name"] in hp for m in svc["volumeMounts"]),
         f"{where}: /dev/hugepages is the HugePages emptyDir")
    sc = svc["securityContext"]
    need(sc.get("allowPrivilegeEscalation") is True, f"{where}: allowPrivilegeEscalation (file capabilities)")
    need(sc.get("privileged") is not True, f"{where}: not privileged")
    for c in spec.get("initContainers", []):
        need(c.get("securityContext", {}).get("privileged") is not True, f"{where}: {c['name']} not privileged")
    for p in ("livenessProbe", "readinessProbe", "startupProbe"):
        g = svc.get(p, {}).get("grpc", {})
        need(g.get("port") == 50052 and g.get("service", "") == "", f"{where}: {p}: grpc on 50052, overall health")
    for path in ("/run/dpdk", "/tmp"):
        need(any(m["mountPath"] == path for m in svc["volumeMounts"]), f"{where}: writable {path}")

pod = yaml.safe_load(open(static_path))
pod_checks(static_path, pod["spec"])
need(pod["spec"]["containers"][0]["image"] == "ghcr.io/dpu-service/dpu-service:0.1.0", f"{static_path}: image pinned to 0.1.0")

def chart(path, release, default_config=True):
    docs = documents(path)
    byk = {}
    for d, text in docs:
        byk.setdefault(d["kind"], []).append((d, text))
    need(len(byk.get("DaemonSet", [])) == 1, f"{path}: exactly one DaemonSet")
    need(len(byk.get("ConfigMap", [])) == 1, f"{path}: exactly one ConfigMap")
    (ds, _), (cm, cm_text) = byk["DaemonSet"][0], byk["ConfigMap"][0]
    spec = ds["spec"]["template"]["spec"]
    pod_checks(f"{path} DaemonSet", spec)
    # Helm hashes the ConfigMap template's output: the printed document
    # plus its final newline.
    want = hashlib.sha256((cm_text + "\n").encode()).hexdigest()
    got = ds["spec"]["template"]["metadata"]["annotations"].get("checksum/config")
    need(got == want, f"{path}: checksum/config {got} is not the sha256 of the ConfigMap document ({want})")
    need(ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
         f"{path}: RollingUpdate, maxUnavailable 1")
    need(ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items(),
         f"{path}: the selector matches the pod labels")
    need(ds["metadata"]["labels"].get("app.kubernetes.io/instance") == release, f"{path}: instance label")
    config = tomllib.loads(cm["data"]["config.toml"])
    need(not default_config or "listen" in config.get("grpc", {}), f"{path}: the ConfigMap's config.toml has grpc.listen")
    return docs, ds, spec

a, ds_a, spec_a = chart(a_path, "dpu")
b, _, _ = chart(b_path, "edge-dpu-service")
chart(a2_path, "dpu", default_config=False)
_, _, spec_n = chart(notls_path, "dpu")
# Names derive from the release: the second release's objects are the
# first one's with the release's full name swapped.
names = lambda docs: sorted((d["kind"], d["metadata"]["name"]) for d, _ in docs)
swap = lambda n: re.sub(r"\Adpu-dpu-service", "edge-dpu-service", n)
need(names(b) == sorted((k, swap(n)) for k, n in names(a)),
     f"object names follow the release: {names(a)} vs {names(b)}")
vols = {v["name"]: v for v in spec_a["volumes"]}
need(vols.get("tls", {}).get("secret", {}).get("secretName") == "dpu-dpu-service-tls", f"{a_path}: TLS Secret")
need("tls" not in {v["name"] for v in spec_n["volumes"]}, f"{notls_path}: no TLS volume with tls.enabled=false")
[svc_n] = spec_n["containers"]
need(all(m["name"] != "tls" for m in svc_n["volumeMounts"]), f"{notls_path}: no TLS mount")

for f in failures:
    print("check-manifests:", f, file=sys.stderr)
sys.exit(1 if failures else 0)
PY

step "DPF objects and contract ($dpf)"
"$venv/bin/python" "$dpf/check_dpf.py" check "$work/dpu.yaml" "$work/dpu-dpf.yaml" "$work/dpf-deploy.yaml" \
  "$work/dpf-config.toml" || fail "DPF ($dpf/check_dpf.py, messages above)"

# check_config FILE WHAT: FILE passes $DPU_SERVICE_BIN --check-config.
check_config() {
  step "$DPU_SERVICE_BIN --check-config on $2 ($1)"
  local state
  state=$(mktemp -d)
  # The state directory of the configuration (/var/lib/dpu-service) is the
  # DPU's; --check-config opens a scratch one instead.
  if ! "$DPU_SERVICE_BIN" --config "$1" --state-dir "$state" --check-config; then
    rm -rf "$state"
    fail "$2 (written to $1) is refused by $DPU_SERVICE_BIN --check-config (error above)"
  fi
  rm -rf "$state"
}
if [ -n "${DPU_SERVICE_BIN:-}" ]; then
  check_config "$work/config.toml" "the chart's configuration (values.yaml \`config\`)"
  check_config "$work/dpf-config.toml" "the configuration DPF deploys ($dpf/dpuserviceconfiguration.yaml)"
fi
echo "check-manifests: static pod, Helm chart and DPF objects valid"
