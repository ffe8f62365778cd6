#!/usr/bin/env bash
# Validates the Kubernetes manifests offline: the static pod
# (images/k8s/dpu-service.yaml) and the Helm chart (images/helm/dpu-service).
#
#  - yamllint on the hand-written YAML;
#  - the chart rendered as `helm template` would (images/render-chart: Go's
#    text/template with sprig and Helm's own functions, built from Debian's
#    Go packages, since helm is in none of the registries this machine
#    reaches), twice, under two release names;
#  - kubernetes-validate --strict against Kubernetes 1.30's schemas for the
#    static pod and every rendered document;
#  - the properties a DPU deployment needs (images/check_manifests.py);
#  - with DPU_SERVICE_BIN set to a dpu-service binary: the chart's
#    configuration passes that binary's --check-config.
# Installs what it needs (Debian's golang and sprig, a Python venv with
# kubernetes-validate and yamllint under target/).
set -euo pipefail
cd "$(dirname "$0")/.."

tdir=$(realpath -m "${CARGO_TARGET_DIR:-target}")
work="$tdir/manifests"
mkdir -p "$work"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

need=()
command -v go >/dev/null || need+=(golang-go)
[ -d /usr/share/gocode/src/github.com/Masterminds/sprig ] || need+=(golang-github-masterminds-sprig-dev)
[ -d /usr/share/gocode/src/gopkg.in/yaml.v3 ] || need+=(golang-gopkg-yaml.v3-dev)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if ((${#need[@]})); then
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

venv="$tdir/manifest-venv"
if [ ! -x "$venv/bin/kubernetes-validate" ] || [ ! -x "$venv/bin/yamllint" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate yamllint pyyaml
fi

# The renderer: GOPATH mode over Debian's Go sources, no module downloads.
render="$work/render-chart"
(cd images/render-chart && GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off GOFLAGS= \
  GOCACHE="$work/go-cache" go build -o "$render" .)

chart=images/helm/dpu-service
"$render" -name dpu "$chart" >"$work/dpu.yaml"
"$render" -name edge-dpu-service -namespace dpu-system "$chart" >"$work/edge.yaml"
# Release "dpu" again with one configuration value changed: its pods must roll.
printf 'config: |\n  [log]\n  level = "debug"\n' >"$work/other-config.yaml"
"$render" -name dpu -values "$work/other-config.yaml" "$chart" >"$work/dpu-other-config.yaml"

"$venv/bin/yamllint" -d '{extends: default, rules: {line-length: {max: 140}, document-start: disable, comments: {min-spaces-from-content: 1}}}' \
  images/k8s/dpu-service.yaml "$chart/values.yaml" "$chart/Chart.yaml"

"$venv/bin/kubernetes-validate" --strict -k 1.30.0 images/k8s/dpu-service.yaml "$work/dpu.yaml" "$work/edge.yaml"

"$venv/bin/python" images/check_manifests.py images/k8s/dpu-service.yaml "$work/dpu.yaml" "$work/edge.yaml" "$work/dpu-other-config.yaml" \
  dpu-service/dpu-service/config/production.toml "$work/config.toml"

if [ -n "${DPU_SERVICE_BIN:-}" ]; then
  state=$(mktemp -d)
  "$DPU_SERVICE_BIN" --config "$work/config.toml" --state-dir "$state" --check-config ||
    { rm -rf "$state"; echo "manifests: the chart's configuration fails dpu-service --check-config" >&2; exit 1; }
  rm -rf "$state"
fi
echo "manifests: static pod and Helm chart valid"
