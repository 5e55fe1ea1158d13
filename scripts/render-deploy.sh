#!/usr/bin/env bash
# Renders deploy/weightcache.yaml, the plain manifests, from helm/weightcache with default values
# (release "weightcache" in namespace "weightcache"), preceded by the Namespace object.
#   scripts/render-deploy.sh           rewrite deploy/weightcache.yaml
#   scripts/render-deploy.sh --check   exit 1 (with a diff) when it is out of date
# Helm: $HELM, else /opt/weightcache-tools/helm4/helm (scripts/install-helm.sh), else helm on PATH.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/deploy/weightcache.yaml"
helm="${HELM:-}"
if [[ -z "$helm" ]]; then
  if [[ -x /opt/weightcache-tools/helm4/helm ]]; then helm=/opt/weightcache-tools/helm4/helm
  else helm="$(command -v helm || true)"; fi
fi
[[ -n "$helm" ]] || { echo "render-deploy: no helm (run scripts/install-helm.sh)" >&2; exit 2; }

render() {
  cat <<'HDR'
# Plain manifests for weightcache, rendered from helm/weightcache with its default values by
# scripts/render-deploy.sh. Do not edit: change the chart and re-render.
#   kubectl apply -f deploy/weightcache.yaml
# The daemon's namespace must allow hostPath volumes (Pod Security "privileged"); engine pods
# in other namespaces can stay at "baseline" (see docs/kubernetes.md).
---
apiVersion: v1
kind: Namespace
metadata:
  name: weightcache
  labels:
    pod-security.kubernetes.io/enforce: privileged
HDR
  "$helm" template weightcache "$root/helm/weightcache" --namespace weightcache
}

if [[ "${1:-}" == "--check" ]]; then
  if ! diff -u "$out" <(render); then
    echo "render-deploy: deploy/weightcache.yaml is out of date; run scripts/render-deploy.sh" >&2
    exit 1
  fi
  echo "render-deploy: deploy/weightcache.yaml is up to date"
else
  render > "$out"
  echo "render-deploy: wrote $out"
fi
