#!/usr/bin/env bash
# Chart tests, with Helm 3 and Helm 4 (scripts/install-helm.sh installs both):
# lint, render with default values and with every option on, assert the DaemonSet's key
# properties, the monitors' API gating, the schema's rejections, offline Kubernetes schema
# validation of everything rendered, and that deploy/weightcache.yaml is up to date.
# Exit 0: all passed; 1: some check failed; 77: skipped, no helm installed.
set -uo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
chart="$root/helm/weightcache"
tools="${WEIGHTCACHE_TOOLS:-/opt/weightcache-tools}"
all_values="$root/tests/kube/values-all.yaml"

helms=()
for h in "$tools/helm3/helm" "$tools/helm4/helm"; do
  [[ -x "$h" ]] && helms+=("$h")
done
if [[ ${#helms[@]} -eq 0 ]] && command -v helm >/dev/null; then helms+=("$(command -v helm)"); fi
if [[ ${#helms[@]} -eq 0 ]]; then
  echo "SKIP: helm is not installed (run scripts/install-helm.sh); chart tests not run"
  exit 77
fi
[[ ${#helms[@]} -lt 2 ]] && echo "note: only ${helms[*]} found; the chart is meant to be tested with Helm 3 and 4"

validator=""
if [[ -d "$tools/node/node_modules/kubernetes-models" ]] && command -v node >/dev/null; then
  validator="$root/tests/kube/validate-manifests.mjs"
else
  echo "note: kubernetes-models not installed in $tools/node (scripts/install-helm.sh): schema validation not run"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL [$tag] $*"; }
# expect "what" command...: the command must succeed.
expect() { local what="$1"; shift; if "$@" >"$work/last.out" 2>&1; then ok; else bad "$what"; sed 's/^/    /' "$work/last.out" | head -20; fi; }
# expect_fail "what" "message regex" command...: the command must fail and print the message.
expect_fail() {
  local what="$1" msg="$2"; shift 2
  if "$@" >"$work/last.out" 2>&1; then bad "$what: succeeded, should have failed"
  elif ! grep -qE -- "$msg" "$work/last.out"; then bad "$what: error lacks /$msg/"; sed 's/^/    /' "$work/last.out" | head -10
  else ok; fi
}
has() { grep -qE -- "$2" "$1"; }          # has FILE REGEX
lacks() { ! grep -qE -- "$2" "$1"; }      # lacks FILE REGEX
# doc FILE KIND > OUT: the rendered object(s) of one kind.
doc() { awk -v kind="$2" 'BEGIN{RS="\n---\n"} $0 ~ "\nkind: " kind "\n" {print}' "$1"; }
# after FILE REGEX N REGEX2: REGEX2 occurs within N lines after a line matching REGEX.
after() { grep -A"$3" -E -- "$2" "$1" | grep -qE -- "$4"; }
# peer_ingress FILE > OUT: the ingress rules of the peers' NetworkPolicy (release wc).
peer_ingress() {
  awk 'BEGIN{RS="\n---\n"} /\nkind: NetworkPolicy\n/ && /\n  name: wc-weightcache-peers\n/ {print}' "$1" |
    sed -n '/^  ingress:$/,$p'
}
# want_peer_ingress FROM TO > OUT: those rules as they must be: the peer port and UCX's ports
# FROM..TO from the DaemonSet's own pods, the metrics port from anywhere, nothing else.
want_peer_ingress() {
  cat <<EOF
  ingress:
    - ports:
        - port: peer
          protocol: TCP
        - port: $1
          endPort: $2
          protocol: TCP
      from:
        - podSelector:
            matchLabels:
              app.kubernetes.io/name: weightcache
              app.kubernetes.io/instance: wc
    - ports:
        - port: metrics
          protocol: TCP
EOF
}

for helm in "${helms[@]}"; do
  tag="$("$helm" version --short 2>/dev/null || echo "$helm")"
  echo "== $tag"

  # Lint.
  expect "lint" "$helm" lint "$chart"
  expect "lint --strict" "$helm" lint --strict "$chart"
  expect "lint --strict, all options" "$helm" lint --strict "$chart" -f "$all_values"

  # Defaults.
  d="$work/defaults.yaml"
  expect "template defaults" "$helm" template wc "$chart" --namespace wc --output-dir "$work/unused"
  "$helm" template wc "$chart" --namespace wc >"$d" 2>"$work/err" || bad "template defaults: $(cat "$work/err")"
  doc "$d" DaemonSet >"$work/ds.yaml"
  ds="$work/ds.yaml"
  expect "one DaemonSet" test "$(grep -c '^kind: DaemonSet' "$d")" -eq 1
  expect "no nvidia.com/gpu request" lacks "$ds" '^[[:space:]]*nvidia\.com/gpu[[:space:]]*:'
  expect "system-node-critical" has "$ds" '^      priorityClassName: system-node-critical$'
  expect "toleration nvidia.com/gpu" after "$ds" '^      tolerations:' 4 'key: nvidia\.com/gpu'
  expect "toleration Exists" after "$ds" '^      tolerations:' 4 'operator: Exists'
  expect "GPU node affinity" after "$ds" 'requiredDuringSchedulingIgnoredDuringExecution' 6 'key: nvidia\.com/gpu\.present'
  expect "NVIDIA_VISIBLE_DEVICES=all" after "$ds" 'name: NVIDIA_VISIBLE_DEVICES$' 1 'value: all$'
  expect "NODE_NAME from Downward API" after "$ds" 'name: NODE_NAME$' 3 'fieldPath: spec\.nodeName$'
  expect "no runtimeClassName by default" lacks "$ds" 'runtimeClassName'
  expect "socket dir hostPath" after "$ds" 'hostPath:$' 1 'path: /run/weightcache$'
  expect "device-plugins hostPath" after "$ds" 'hostPath:$' 1 'path: /var/lib/kubelet/device-plugins$'
  expect "models hostPath" after "$ds" 'hostPath:$' 1 'path: /models$'
  for flag in --socket_dir=/run/weightcache --spec_file=/etc/weightcache/models.yaml \
              --backend=auto --metrics_address=0.0.0.0:9464 --device_plugin \
              --kubelet_dir=/var/lib/kubelet/device-plugins --device_plugin_slots=64 \
              --model_roots=/models --max_connections_per_pod=256; do
    expect "flag $flag" has "$ds" "^            - ${flag}\$"
  done
  expect "no --memory_budget by default" lacks "$ds" 'memory-budget'
  # Identity given (issue 57): the kubelet names each engine pod's sockets through the CSI
  # driver, so the daemon needs no view of the node's processes.
  expect "no hostPID: pods named by their CSI volumes" has "$ds" '^      hostPID: false$'
  for flag in --csi_endpoint=/var/lib/kubelet/plugins/csi.weightcache.io/csi.sock \
              --csi_registration_dir=/var/lib/kubelet/plugins_registry \
              --csi_pods_dir=/var/lib/kubelet/pods \
              --pod_volumes_file=/var/lib/weightcache/pod-volumes.json; do
    expect "flag $flag" has "$ds" "^            - ${flag}\$"
  done
  expect "kubelet pods dir hostPath" after "$ds" 'hostPath:$' 1 'path: /var/lib/kubelet/pods$'
  expect "kubelet pods dir HostToContainer" after "$ds" 'mountPath: /var/lib/kubelet/pods$' 1 'mountPropagation: HostToContainer$'
  doc "$d" CSIDriver >"$work/csidriver.yaml"
  expect "CSIDriver csi.weightcache.io" has "$work/csidriver.yaml" '^  name: csi\.weightcache\.io$'
  expect "CSIDriver podInfoOnMount" has "$work/csidriver.yaml" '^  podInfoOnMount: true$'
  expect "CSIDriver ephemeral only" after "$work/csidriver.yaml" 'volumeLifecycleModes:$' 1 '- Ephemeral$'
  expect "CSIDriver attachRequired false" has "$work/csidriver.yaml" '^  attachRequired: false$'
  # With csi off, the cgroup fallback asks for hostPID itself.
  "$helm" template wc "$chart" --namespace wc --set csi.enabled=false --set daemon.hostPID=true \
    >"$work/nocsi.yaml" 2>"$work/err" || bad "template csi off: $(cat "$work/err")"
  expect "csi off: no CSIDriver" lacks "$work/nocsi.yaml" 'kind: CSIDriver$'
  expect "csi off: no csi flag" lacks "$work/nocsi.yaml" '--csi_endpoint'
  expect "csi off: hostPID as set" has "$work/nocsi.yaml" '^      hostPID: true$'
  # Roles are granted, never implied: no role flag for the engine socket by default, the
  # admin socket in the daemon's own emptyDir, daemon state outside the engines' socket dir.
  expect "no admin or publish uids by default" lacks "$ds" '_uids=|_gids=|publish_namespaces'
  expect "admin socket in the daemon's own directory" has "$ds" '^            - --admin_socket_dir=/run/weightcache-admin$'
  expect "admin socket dir is an emptyDir" after "$ds" '- name: admin-socket$' 1 'emptyDir: \{\}'
  # The kubelet makes an emptyDir 0777, which the daemon refuses (it never chmods what it did
  # not create): an init container makes it the daemon's alone first (issue 47).
  expect "admin socket dir made 0700 before the daemon starts" has "$ds" '^          command: \["chmod", "0700", "/run/weightcache-admin"\]$'
  expect "digest store outside the socket dir" has "$ds" '^            - --digest_store=/var/lib/weightcache/digests.json$'
  expect "no keeper by default" has "$ds" '^            - --keeper_socket=off$'
  expect "artifact budget" has "$ds" '^            - --artifact_budget=1GiB$'
  expect "artifacts in memory only by default" lacks "$ds" 'artifact_dir'
  expect "metrics port" has "$ds" 'containerPort: 9464$'
  expect "liveness /healthz" after "$ds" 'livenessProbe:' 4 'path: /healthz'
  expect "readiness /readyz" after "$ds" 'readinessProbe:' 4 'path: /readyz'
  expect "models ConfigMap mounted" after "$ds" 'name: models-config$' 1 'mountPath: /etc/weightcache$'
  expect "no privilege escalation" has "$ds" 'allowPrivilegeEscalation: false'
  expect "resources" after "$ds" '^          resources:' 3 'memory: '
  expect "ConfigMap: empty model list" has "$d" '^    models: \[\]$'
  expect "ServiceAccount" has "$d" '^kind: ServiceAccount$'
  doc "$d" Service >"$work/svc.yaml"
  expect "Service scrape annotation" has "$work/svc.yaml" 'prometheus\.io/scrape: "true"'
  expect "Service port annotation" has "$work/svc.yaml" 'prometheus\.io/port: "9464"'
  expect "Service path annotation" has "$work/svc.yaml" 'prometheus\.io/path: /metrics'
  expect "no monitors by default" lacks "$d" '^kind: (PodMonitor|ServiceMonitor)$'
  expect "no monitors by default, even with the API" lacks \
    <("$helm" template wc "$chart" --api-versions monitoring.coreos.com/v1) '^kind: (Pod|Service)Monitor$'

  # Every option on, without the prometheus-operator API: monitors asked for but not rendered.
  a="$work/all.yaml"
  "$helm" template wc "$chart" --namespace wc -f "$all_values" >"$a" 2>"$work/err" || bad "template all: $(cat "$work/err")"
  doc "$a" DaemonSet >"$ds"
  expect "monitors gated on the API" lacks "$a" '^kind: (PodMonitor|ServiceMonitor)$'
  expect "runtimeClassName" has "$ds" '^      runtimeClassName: nvidia$'
  expect "model roots" has "$ds" '^            - --model_roots=/models,/scratch/models$'
  expect "admin uids" has "$ds" '^            - --admin_uids=0,1000$'
  expect "admin gids" has "$ds" '^            - --admin_gids=2000$'
  expect "publish uids" has "$ds" '^            - --publish_uids=1000$'
  expect "publish gids" has "$ds" '^            - --publish_gids=3000$'
  expect "publish namespaces" has "$ds" '^            - --publish_namespaces=team-a$'
  expect "admin socket dir" has "$ds" '^            - --admin_socket_dir=/run/wc-admin$'
  expect "the init container chmods that admin socket dir" has "$ds" '^          command: \["chmod", "0700", "/run/wc-admin"\]$'
  expect "state dir" has "$ds" '^            - --digest_store=/var/lib/wc-state/digests.json$'
  expect "artifacts persisted under the state dir" has "$ds" '^            - --artifact_dir=/var/lib/wc-state/artifacts$'
  expect "artifact dir budget" has "$ds" '^            - --artifact_dir_budget=2GiB$'
  expect "artifact sizes" has "$ds" '^            - --artifact_max_bytes=1GiB$'
  expect "models PVC" after "$ds" 'persistentVolumeClaim:$' 1 'claimName: model-store$'
  expect "custom kubelet dir" after "$ds" 'hostPath:$' 1 'path: /var/lib/k0s/kubelet/device-plugins$'
  expect "slots flag" has "$ds" '- --device_plugin_slots=16$'
  expect "memory budget flag" has "$ds" '- --memory_budget=120GiB$'
  expect "extra args" has "$ds" '- --verbose$'
  expect "metrics port flag" has "$ds" '- --metrics_address=0\.0\.0\.0:9500$'
  expect "still no nvidia.com/gpu request" lacks "$ds" '^[[:space:]]*nvidia\.com/gpu[[:space:]]*:'
  doc "$a" ConfigMap >"$work/cm.yaml"
  cm="$work/cm.yaml"
  expect "ConfigMap models.yaml key" has "$cm" '^  models\.yaml: \|$'
  expect "ConfigMap models list" has "$cm" '^    models:$'
  expect "ConfigMap spec name" has "$cm" '^      name: llama-8b$'
  expect "ConfigMap spec model_dir" has "$cm" 'model_dir: /models/llama-8b$'
  expect "ConfigMap spec architecture" has "$cm" 'architecture: LlamaForCausalLM$'
  expect "ConfigMap spec quantization" has "$cm" 'quantization: fp8_block$'
  expect "ConfigMap spec tp_size" has "$cm" 'tp_size: 8$'
  expect "ConfigMap spec tp_ranks" after "$cm" 'tp_ranks:$' 8 '- 7$'
  expect "ConfigMap spec dtype" has "$cm" 'dtype: bf16$'
  expect "ConfigMap spec layout" has "$cm" 'layout: sglang$'
  expect "ConfigMap spec version defaults to 1" test "$(grep -c 'version: 1$' "$cm")" -eq 2
  expect "checksum annotation changes with models" test \
    "$(grep checksum/models "$d")" != "$(grep checksum/models "$a")"

  # With the API: both monitors, with the extra labels for the release selector.
  m="$work/monitors.yaml"
  "$helm" template wc "$chart" -f "$all_values" --api-versions monitoring.coreos.com/v1 >"$m" 2>"$work/err" || bad "template monitors: $(cat "$work/err")"
  expect "PodMonitor with the API" has "$m" '^kind: PodMonitor$'
  expect "ServiceMonitor with the API" has "$m" '^kind: ServiceMonitor$'
  expect "PodMonitor release label" after <(doc "$m" PodMonitor) '^  labels:' 8 'release: kube-prometheus-stack'
  expect "ServiceMonitor release label" after <(doc "$m" ServiceMonitor) '^  labels:' 8 'release: kube-prometheus-stack'

  # Alerts: a PrometheusRule by default wherever the API is served, holding files/alerts.yaml's
  # rules as they are (the file promtool tests: ctest prometheus_alert_rules), each runbook_url
  # under metrics.prometheusRule.runbookBaseUrl; none without the API or when disabled.
  expect "no PrometheusRule without the API" lacks "$d" '^kind: PrometheusRule$'
  pr="$work/rule.yaml"
  "$helm" template wc "$chart" --namespace wc --api-versions monitoring.coreos.com/v1 \
    --set metrics.prometheusRule.runbookBaseUrl=https://docs.example/wc/ \
    --set metrics.prometheusRule.labels.release=kube-prometheus-stack >"$pr" 2>"$work/err" ||
    bad "template rule: $(cat "$work/err")"
  doc "$pr" PrometheusRule >"$work/rule-doc.yaml"
  expect "PrometheusRule by default with the API" has "$work/rule-doc.yaml" '^kind: PrometheusRule$'
  expect "PrometheusRule release label" after "$work/rule-doc.yaml" '^  labels:' 8 'release: kube-prometheus-stack'
  want_alerts="$(sed -n 's/^ *- alert: //p' "$chart/files/alerts.yaml")"
  expect "PrometheusRule: the file's alerts, in order" test "$(sed -n 's/^ *- alert: //p' "$work/rule-doc.yaml")" = "$want_alerts"
  expect "PrometheusRule: the file's expressions" test \
    "$(grep -c -- '- alert: ' "$work/rule-doc.yaml")" -eq "$(grep -c '^ *expr: ' "$work/rule-doc.yaml")"
  expect "PrometheusRule: every runbook_url under the base" test \
    "$(grep -c 'runbook_url: https://docs\.example/wc/docs/metrics\.md#weightcache' "$work/rule-doc.yaml")" -eq \
    "$(grep -c -- '- alert: ' "$chart/files/alerts.yaml")"
  if command -v promtool >/dev/null; then
    sed -n '/^spec:$/,$p' "$work/rule-doc.yaml" | tail -n +2 | sed 's/^  //' >"$work/rule-spec.yaml"
    expect "PrometheusRule: promtool accepts its rules" promtool check rules "$work/rule-spec.yaml"
    # The rendered rules are the file's: promtool's tests pass against them too.
    sed "s|\.\./\.\./helm/weightcache/files/alerts\.yaml|$work/rule-spec.yaml|" \
      "$root/tests/metrics/alerts_test.yaml" | sed 's|runbook_url: docs/metrics|runbook_url: https://docs.example/wc/docs/metrics|' \
      >"$work/rule-test.yaml"
    expect "PrometheusRule: the alerts' tests pass on the rendered rules" promtool test rules "$work/rule-test.yaml"
  fi
  expect "PrometheusRule disabled" lacks <("$helm" template wc "$chart" --api-versions monitoring.coreos.com/v1 \
    --set metrics.prometheusRule.enabled=false) '^kind: PrometheusRule$'

  # The Grafana dashboard: off by default; on, a ConfigMap for the sidecar holding the file.
  expect "no dashboard by default" lacks "$d" 'grafana_dashboard'
  gd="$work/dashboard.yaml"
  "$helm" template wc "$chart" --namespace wc --set metrics.dashboard.enabled=true \
    --set metrics.dashboard.namespace=monitoring --set metrics.dashboard.annotations.grafana_folder=weightcache \
    >"$gd" 2>"$work/err" || bad "template dashboard: $(cat "$work/err")"
  awk 'BEGIN{RS="\n---\n"} /\nkind: ConfigMap\n/ && /\n  name: wc-weightcache-dashboard\n/ {print}' "$gd" >"$work/dash-cm.yaml"
  expect "dashboard: sidecar label" after "$work/dash-cm.yaml" '^  labels:' 8 'grafana_dashboard: "1"'
  expect "dashboard: namespace" has "$work/dash-cm.yaml" '^  namespace: monitoring$'
  expect "dashboard: folder annotation" after "$work/dash-cm.yaml" '^  annotations:' 1 'grafana_folder: weightcache'
  sed -n '/^  weightcache\.json: |-$/,$p' "$work/dash-cm.yaml" | tail -n +2 | sed 's/^    //' >"$work/dash.json"
  expect "dashboard: the file as it is" diff <(cat "$chart/files/dashboard.json") "$work/dash.json"
  expect_fail "schema: dashboard namespace" 'namespace' "$helm" template wc "$chart" \
    --set metrics.dashboard.namespace=Bad_NS

  # Namespace rules: off by default (no flag, no pod-resources mount); on in values-all.
  expect "namespace rules off by default" lacks "$d" 'namespace_rules|pod-resources'
  expect "namespace rules flag" has "$ds" '^            - --namespace_rules$'
  expect "pod resources socket flag" has "$ds" \
    '^            - --pod_resources_socket=/var/lib/k0s/kubelet/pod-resources/kubelet\.sock$'
  expect "pod resources cache flag" has "$ds" '^            - --pod_resources_cache=5$'
  expect "pod resources mount read-only" after "$ds" 'mountPath: /var/lib/k0s/kubelet/pod-resources$' 1 'readOnly: true$'
  expect "pod resources hostPath" after "$ds" 'name: pod-resources$' 2 'path: /var/lib/k0s/kubelet/pod-resources$'
  expect "ConfigMap spec allowed_namespaces" after "$cm" 'allowed_namespaces:$' 2 '- team-b$'
  expect "ConfigMap spec isolation" has "$cm" '^ *isolation: namespace$'
  expect_fail "namespace rules need the device plugin" 'needs devicePlugin.enabled' "$helm" template wc "$chart" \
    --set namespaceRules.enabled=true,devicePlugin.enabled=false
  expect_fail "schema: bad allowed namespace" 'allowed_namespaces|pattern' "$helm" template wc "$chart" \
    --set 'models[0].name=x,models[0].model_dir=/m,models[0].allowed_namespaces[0]=Team_A'
  expect_fail "schema: namespace rules cache negative" 'cacheSeconds' "$helm" template wc "$chart" \
    --set namespaceRules.cacheSeconds=-1
  expect_fail "private copies need the namespace rules" 'isolation: namespace, which needs namespaceRules.enabled' \
    "$helm" template wc "$chart" --set 'models[0].name=x,models[0].model_dir=/m,models[0].isolation=namespace'
  expect_fail "schema: bad isolation" 'isolation' "$helm" template wc "$chart" \
    --set 'models[0].name=x,models[0].model_dir=/m,models[0].isolation=tenant'
  # Pinned digests pass through per model, and the schema refuses malformed ones.
  expect "ConfigMap spec digests" after "$cm" '^ *digests:$' 2 \
    'model-00002-of-00002\.safetensors: "?60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"?$'
  expect_fail "schema: digest not 64 hex" 'digests|pattern' "$helm" template wc "$chart" \
    --set 'models[0].name=x,models[0].model_dir=/m,models[0].digests.model\.safetensors=abc'
  expect_fail "schema: digest for a non-checkpoint file" 'digests|additional' "$helm" template wc "$chart" \
    --set "models[0].name=x,models[0].model_dir=/m,models[0].digests.config\.json=$(printf 'a%.0s' {1..64})"

  # Device plugin off: no flag, no kubelet hostPath.
  "$helm" template wc "$chart" --set devicePlugin.enabled=false >"$work/nodp.yaml"
  expect "device plugin off: no flag" lacks "$work/nodp.yaml" '--device_plugin'
  expect "device plugin off: no kubelet dir" lacks "$work/nodp.yaml" 'device-plugins'

  # The schema and the template guards reject bad values.
  expect_fail "schema: slots not an integer" 'slots' "$helm" template wc "$chart" --set devicePlugin.slots=x
  expect_fail "schema: slots 0" 'slots' "$helm" template wc "$chart" --set devicePlugin.slots=0
  expect_fail "schema: port out of range" 'port' "$helm" template wc "$chart" --set metrics.port=70000
  expect_fail "schema: bad memory budget" "memoryBudget" "$helm" template wc "$chart" --set daemon.memoryBudget=90XB
  expect_fail "schema: memory budget share over 100%" "memoryBudget" "$helm" template wc "$chart" --set daemon.memoryBudget=120%
  # No budget, no render: one engine pod could fill every GPU (issue 25).
  expect_fail "memory budget required" "daemon.memoryBudget is empty" "$helm" template wc "$chart" --set daemon.memoryBudget=''
  expect "memory budget by default: a share" has "$d" '^            - --memory_budget=80%$'
  expect_fail "schema: bad backend" 'backend' "$helm" template wc "$chart" --set daemon.backend=gpu
  expect_fail "schema: bad volume type" 'type' "$helm" template wc "$chart" --set modelsVolume.type=nfs
  expect_fail "schema: bad model name" 'name' "$helm" template wc "$chart" \
    --set 'models[0].name=Llama,models[0].model_dir=/models/x'
  expect_fail "schema: unknown spec key" 'tp_sise|additional' "$helm" template wc "$chart" \
    --set 'models[0].name=x,models[0].model_dir=/models/x,models[0].tp_sise=2'
  expect_fail "schema: missing model_dir" 'model_dir' "$helm" template wc "$chart" --set 'models[0].name=x'
  expect_fail "schema: bad quantization" 'quantization' "$helm" template wc "$chart" \
    --set 'models[0].name=x,models[0].model_dir=/m,models[0].quantization=awq'
  expect_fail "schema: unknown top-level key" 'slotz|additional' "$helm" template wc "$chart" --set slotz=3
  expect_fail "pvc needs a claim" 'claimName' "$helm" template wc "$chart" --set modelsVolume.type=pvc
  expect_fail "schema: keeper updateStrategy" 'updateStrategy' "$helm" template wc "$chart" \
    --set keeper.enabled=true,keeper.updateStrategy=Never
  expect_fail "schema: keeper socketDir relative" 'socketDir' "$helm" template wc "$chart" \
    --set keeper.socketDir=run/k

  # The keeper: its own DaemonSet (a daemon rollout leaves it running), sharing a hostPath
  # socket dir with the daemon; rolled only on delete.
  k="$work/keeper.yaml"
  "$helm" template wc "$chart" --namespace wc --set keeper.enabled=true >"$k" 2>"$work/err" \
    || bad "template keeper: $(cat "$work/err")"
  expect "keeper: two DaemonSets" test "$(grep -c '^kind: DaemonSet' "$k")" -eq 2
  expect "keeper: daemon flag" has "$k" '^            - --keeper_socket=/run/weightcache-keeper/keeper\.sock$'
  expect "keeper: keeper flag" has "$k" '^            - --socket=/run/weightcache-keeper/keeper\.sock$'
  expect "keeper: command" has "$k" 'command: \["weightcache-keeper"\]'
  expect "keeper: OnDelete" after "$k" '^  updateStrategy:$' 1 'type: OnDelete$'
  expect "keeper: own selector" has "$k" '^      app\.kubernetes\.io/name: weightcache-keeper$'
  expect "keeper: hostPath" after "$k" 'hostPath:$' 1 'path: /run/weightcache-keeper$'

  # The webhook: off by default; on, a Deployment of 2, a PDB, a Service, the webhook
  # configuration with the chart's CA in caBundle and the serving pair in a TLS Secret.
  expect "no webhook by default" lacks "$d" 'kind: (MutatingWebhookConfiguration|PodDisruptionBudget)$'
  w="$work/webhook.yaml"
  "$helm" template wc "$chart" --namespace wc --set webhook.enabled=true >"$w" 2>"$work/err" \
    || bad "template webhook: $(cat "$work/err")"
  doc "$w" Deployment >"$work/wd.yaml"
  expect "webhook: 2 replicas" has "$work/wd.yaml" '^  replicas: 2$'
  expect "webhook: command" has "$work/wd.yaml" 'command: \["weightcache-webhook"\]'
  expect "webhook: cert flag" has "$work/wd.yaml" '- --tls_cert_file=/etc/weightcache-webhook/tls/tls\.crt$'
  expect "webhook: handshake timeout" has "$work/wd.yaml" '- --handshake_timeout_ms=1000$'
  expect "webhook: per-source limit" has "$work/wd.yaml" '- --max_connections_per_source=256$'
  expect "webhook: injects the CSI volume" has "$work/wd.yaml" '- --inject=csi$'
  expect "webhook: engines see it at /run/weightcache" has "$work/wd.yaml" '- --socket_mount_path=/run/weightcache$'
  expect_fail "schema: webhook handshake timeout 0" 'handshakeTimeoutMs' "$helm" template wc "$chart" \
    --set webhook.enabled=true --set webhook.handshakeTimeoutMs=0
  expect "webhook: HTTPS probe" after "$work/wd.yaml" 'readinessProbe:' 4 'scheme: HTTPS'
  expect "webhook: no token" has "$work/wd.yaml" 'automountServiceAccountToken: false'
  expect "webhook: PDB" after <(doc "$w" PodDisruptionBudget) '^spec:' 1 'minAvailable: 1'
  doc "$w" MutatingWebhookConfiguration >"$work/mwc.yaml"
  expect "webhook: v1 reviews" has "$work/mwc.yaml" 'admissionReviewVersions: \["v1"\]'
  expect "webhook: sideEffects None" has "$work/mwc.yaml" 'sideEffects: None$'
  expect "webhook: failurePolicy Ignore" has "$work/mwc.yaml" 'failurePolicy: Ignore$'
  expect "webhook: timeout 5" has "$work/mwc.yaml" 'timeoutSeconds: 5$'
  expect "webhook: pods on CREATE" after "$work/mwc.yaml" 'operations: \["CREATE"\]' 3 'resources: \["pods"\]'
  expect "webhook: own namespace excluded" has "$work/mwc.yaml" 'values: \[kube-system, wc\]'
  expect "webhook: no objectSelector by default" lacks "$work/mwc.yaml" 'objectSelector'
  ca_bundle=$(sed -n 's/^      caBundle: //p' "$work/mwc.yaml")
  expect "webhook: caBundle is the Secret's CA" test -n "$ca_bundle" -a \
    "$(doc "$w" Secret | sed -n 's/^  ca\.crt: //p')" = "$ca_bundle"
  expect "webhook: caBundle is a CA certificate" bash -c \
    "echo '$ca_bundle' | base64 -d | openssl x509 -noout -text | grep -q 'CA:TRUE'"
  expect "webhook: no NetworkPolicy by default" lacks "$w" '^kind: NetworkPolicy$'
  doc "$a" MutatingWebhookConfiguration >"$work/mwc-all.yaml"
  expect "webhook all: failurePolicy" has "$work/mwc-all.yaml" 'failurePolicy: Fail$'
  expect "webhook all: timeout" has "$work/mwc-all.yaml" 'timeoutSeconds: 3$'
  expect "webhook all: namespaceSelector" after "$work/mwc-all.yaml" 'namespaceSelector:' 2 'weightcache\.io/engines: "true"'
  expect "webhook all: objectSelector" after "$work/mwc-all.yaml" 'objectSelector:' 3 'key: weightcache\.io/skip'
  expect "webhook all: NetworkPolicy" after <(doc "$a" NetworkPolicy) 'ipBlock:' 1 'cidr: 10\.0\.0\.0/24'
  expect "webhook all: port" has "$a" '- --address=0\.0\.0\.0:9443$'
  c="$work/certmanager.yaml"
  "$helm" template wc "$chart" --namespace wc --set webhook.enabled=true,webhook.certManager.enabled=true \
    >"$c" 2>"$work/err" || bad "template cert-manager: $(cat "$work/err")"
  expect "cert-manager: Certificate" after <(doc "$c" Certificate) 'secretName:' 0 'wc-weightcache-webhook-tls'
  expect "cert-manager: self-signed Issuer" after <(doc "$c" Issuer) '^spec:' 1 'selfSigned: \{\}'
  expect "cert-manager: CA injected" has "$c" 'cert-manager\.io/inject-ca-from: wc/wc-weightcache-webhook$'
  expect "cert-manager: no caBundle" lacks "$c" '^ *caBundle:'
  expect "cert-manager: no chart Secret" lacks "$c" '^kind: Secret$'
  "$helm" template wc "$chart" --namespace wc -f "$all_values" --set webhook.certManager.enabled=true \
    >"$work/cm-issuer.yaml" 2>"$work/err" || bad "template cert-manager issuer: $(cat "$work/err")"
  expect "cert-manager: issuerRef from values" after <(doc "$work/cm-issuer.yaml" Certificate) 'issuerRef:' 2 'kind: ClusterIssuer'
  expect "cert-manager: no Issuer with issuerRef" lacks "$work/cm-issuer.yaml" '^kind: Issuer$'
  expect_fail "schema: webhook timeout > 5" 'timeoutSeconds' "$helm" template wc "$chart" --set webhook.timeoutSeconds=10
  expect_fail "schema: webhook failurePolicy" 'failurePolicy' "$helm" template wc "$chart" --set webhook.failurePolicy=Allow
  expect_fail "schema: webhook CIDR" 'apiServerCIDRs' "$helm" template wc "$chart" \
    --set 'webhook.networkPolicy.apiServerCIDRs[0]=everywhere'

  # Peer fill: off by default; on, the daemon's flags, port and Secret mount, the fleet CA and
  # certificate (verified as TLS client and server for weightcache-peer), the headless
  # Service and the NetworkPolicy; with cert-manager, its CA chain instead of the Secret.
  expect "peer fill off by default" lacks "$d" 'peer_listen|weightcache-peer'
  expect "peer: flags" has "$ds" '^            - --peer_listen=0\.0\.0\.0:7500$'
  expect "peer: CA flag" has "$ds" '^            - --peer_tls_ca_file=/etc/weightcache-peer/ca\.crt$'
  expect "peer: port caps" has "$ds" '^            - --peer_max_connections=300$'
  expect "peer: port caps per address" has "$ds" '^            - --peer_max_connections_per_address=4$'
  expect "peer: handshake deadline" has "$ds" '^            - --peer_handshake_timeout_ms=5000$'
  expect "peer: container port" after "$ds" '- name: peer$' 1 'containerPort: 7500$'
  expect "peer: Secret mounted read-only" after "$ds" '- name: peer-tls$' 2 'readOnly: true$'
  expect "peer: Secret volume" after "$ds" 'secretName: wc-weightcache-peer-tls$' 1 'defaultMode: 0400$'
  pdir="$work/peer-tls"
  mkdir -p "$pdir"
  doc "$a" Secret | awk '/name: wc-weightcache-peer-tls$/{f=1} f' >"$work/peer-secret.yaml"
  for k in ca.crt tls.crt tls.key; do
    sed -n "s/^  ${k//./\\.}: //p" "$work/peer-secret.yaml" | head -1 | base64 -d >"$pdir/$k" 2>/dev/null
  done
  expect "peer: CA is a CA" bash -c "openssl x509 -in '$pdir/ca.crt' -noout -text | grep -q 'CA:TRUE'"
  expect "peer: certificate names weightcache-peer" bash -c \
    "openssl x509 -in '$pdir/tls.crt' -noout -text | grep -q 'DNS:weightcache-peer'"
  expect "peer: certificate valid as TLS server" openssl verify -purpose sslserver -CAfile "$pdir/ca.crt" "$pdir/tls.crt"
  expect "peer: certificate valid as TLS client" openssl verify -purpose sslclient -CAfile "$pdir/ca.crt" "$pdir/tls.crt"
  expect "peer: key matches the certificate" test "$(openssl pkey -in "$pdir/tls.key" -pubout 2>/dev/null)" = \
    "$(openssl x509 -in "$pdir/tls.crt" -noout -pubkey 2>/dev/null)"
  doc "$a" Service | awk '/name: wc-weightcache-peers$/{f=1} f' >"$work/peer-svc.yaml"
  expect "peer: headless Service" has "$work/peer-svc.yaml" '^  clusterIP: None$'
  expect "peer: Service port" after "$work/peer-svc.yaml" '- name: peer$' 1 'port: 7500$'
  # The peers and UCX: the daemon is told the headless Service's name (it resolves it to every
  # daemon pod on each survey), UCX is pinned to a port range, and the NetworkPolicy opens the
  # peer port and that range to the DaemonSet's own pods and nothing else (UCX's port is
  # unauthenticated: the token handed out over mutual TLS is the capability).
  expect "peer: --peers names the headless Service and the peer port" has "$ds" \
    '^            - --peers=wc-weightcache-peers\.wc\.svc:7500$'
  expect "peer: one --peers" test "$(grep -c -- '- --peers=' "$ds")" -eq 1
  expect "peer: UCX port range" after "$ds" '- name: UCX_TCP_PORT_RANGE$' 1 'value: "7600-7615"$'
  expect "peer: UCX transports" after "$ds" '- name: UCX_TLS$' 1 'value: "tcp"$'
  expect "peer: UCX ports not listed as container ports" lacks "$ds" 'containerPort: 76(0[0-9]|1[0-5])$'
  peer_ingress "$a" >"$work/peer-np.yaml"
  want_peer_ingress 7600 7615 >"$work/peer-np-want.yaml"
  expect "peer: NetworkPolicy: peer port and UCX range from the DaemonSet only, metrics open, nothing else" \
    diff -u "$work/peer-np-want.yaml" "$work/peer-np.yaml"
  pd="$work/peer-defaults.yaml"
  "$helm" template wc "$chart" --namespace wc --set peerFill.enabled=true >"$pd" 2>"$work/err" \
    || bad "template peer defaults: $(cat "$work/err")"
  expect "peer defaults: --peers" has "$pd" '^            - --peers=wc-weightcache-peers\.wc\.svc:7443$'
  expect "peer defaults: port caps" has "$pd" '^            - --peer_max_connections=1024$'
  expect "peer defaults: port caps per address" has "$pd" \
    '^            - --peer_max_connections_per_address=16$'
  expect "peer defaults: handshake deadline" has "$pd" '^            - --peer_handshake_timeout_ms=10000$'
  expect "peer defaults: UCX port range" after "$pd" '- name: UCX_TCP_PORT_RANGE$' 1 'value: "7444-7459"$'
  expect "peer defaults: UCX over TCP" after "$pd" '- name: UCX_TLS$' 1 'value: "tcp"$'
  peer_ingress "$pd" >"$work/peer-np.yaml"
  want_peer_ingress 7444 7459 >"$work/peer-np-want.yaml"
  expect "peer defaults: NetworkPolicy with the UCX range" diff -u "$work/peer-np-want.yaml" "$work/peer-np.yaml"
  # Node identity (issue 57): by default a holder is the node its token proves: the flag, the
  # pod's node, name and uid from the Downward API, the in-cluster credentials in the daemon
  # container, a Role that creates tokens of its own service account only, the issuer's
  # discovery, and the policy that binds a token to the pod asking for it.
  expect "peer identity: token by default" has "$pd" '^            - --peer_identity=token$'
  expect "peer identity: NODE_NAME from spec.nodeName" after "$pd" '- name: NODE_NAME$' 3 'fieldPath: spec\.nodeName$'
  expect "peer identity: POD_NAME from metadata.name" after "$pd" '- name: POD_NAME$' 3 'fieldPath: metadata\.name$'
  expect "peer identity: POD_UID from metadata.uid" after "$pd" '- name: POD_UID$' 3 'fieldPath: metadata\.uid$'
  expect "peer identity: credentials mounted read-only" after "$pd" \
    'mountPath: /var/run/secrets/kubernetes\.io/serviceaccount$' 1 'readOnly: true$'
  expect "peer identity: a projected token, the cluster CA, the namespace" bash -c \
    "grep -A16 -E '^        - name: kube-api-access$' '$pd' | grep -q serviceAccountToken &&
     grep -A16 -E '^        - name: kube-api-access$' '$pd' | grep -q 'name: kube-root-ca.crt' &&
     grep -A16 -E '^        - name: kube-api-access$' '$pd' | grep -q 'fieldPath: metadata.namespace'"
  doc "$pd" Role >"$work/peer-role.yaml"
  expect "peer identity: one Role rule" test "$(grep -c -- '- apiGroups:' "$work/peer-role.yaml")" -eq 1
  expect "peer identity: Role creates serviceaccounts/token" after "$work/peer-role.yaml" '- apiGroups: \[""\]' 3 'verbs: \["create"\]'
  expect "peer identity: ... of its own service account only" has "$work/peer-role.yaml" \
    '^    resourceNames: \["wc-weightcache"\]$'
  expect "peer identity: ... on serviceaccounts/token only" has "$work/peer-role.yaml" \
    '^    resources: \["serviceaccounts/token"\]$'
  expect "peer identity: issuer discovery bound" after <(doc "$pd" ClusterRoleBinding) 'kind: ClusterRole$' 1 \
    'name: system:service-account-issuer-discovery$'
  expect "peer identity: tokens bound to the asking pod" has <(doc "$pd" ValidatingAdmissionPolicy) \
    "authentication\.kubernetes\.io/pod-uid'\]\[0\]"
  expect "peer identity: the policy denies" has <(doc "$pd" ValidatingAdmissionPolicyBinding) \
    'validationActions: \[Deny\]'
  "$helm" template wc "$chart" --namespace wc --set peerFill.enabled=true,peerFill.identity=certificate \
    >"$work/peer-cert.yaml" 2>"$work/err" || bad "template peer certificate: $(cat "$work/err")"
  expect "peer identity certificate: the flag" has "$work/peer-cert.yaml" '^            - --peer_identity=certificate$'
  expect "peer identity certificate: no credentials, RBAC or policy" lacks "$work/peer-cert.yaml" \
    'kube-api-access|POD_UID|kind: Role|issuer-discovery|ValidatingAdmissionPolicy'
  expect "peer fill off: no credentials, RBAC or policy" lacks "$d" \
    'kube-api-access|POD_UID|kind: Role|issuer-discovery|ValidatingAdmissionPolicy'
  expect_fail "schema: peer identity" 'identity' "$helm" template wc "$chart" --set peerFill.identity=cert
  # Token identity needs 1.30 (the chart's kubeVersion is older): a clear refusal before 1.30,
  # certificate identity still installs there.
  expect_fail "peer identity token before Kubernetes 1.30" 'needs Kubernetes 1\.30 or later.*v1\.29\.4' \
    "$helm" template wc "$chart" --kube-version 1.29.4 --set peerFill.enabled=true
  expect "peer identity certificate on Kubernetes 1.29" "$helm" template wc "$chart" --kube-version 1.29.4 \
    --set peerFill.enabled=true,peerFill.identity=certificate
  po="$work/peer-override.yaml"
  "$helm" template wc "$chart" --namespace wc \
    --set 'peerFill.enabled=true,peerFill.peers=10.0.0.5:7443\,gpu-b.example.com:7443' >"$po" 2>"$work/err" \
    || bad "template peer override: $(cat "$work/err")"
  expect "peer: peerFill.peers overrides the list" has "$po" \
    '^            - --peers=10\.0\.0\.5:7443,gpu-b\.example\.com:7443$'
  expect "peer: the override replaces the Service" test "$(grep -c -- '- --peers=' "$po")" -eq 1
  peer_ingress "$po" >"$work/peer-np.yaml"
  expect "peer: the override opens nothing more" diff -u "$work/peer-np-want.yaml" "$work/peer-np.yaml"
  expect "peer fill off: no --peers, no UCX env, no UCX rule" lacks "$d" 'peers=|UCX_|endPort'
  "$helm" template wc "$chart" --set 'peerFill.ucx.portRange=7600-7601,peerFill.peers=h:1' \
    >"$work/peer-off.yaml" 2>"$work/err" || bad "template peer off: $(cat "$work/err")"
  expect "peer fill off, UCX values set: a DaemonSet" has "$work/peer-off.yaml" '^kind: DaemonSet$'
  expect "peer fill off, UCX values set: still none of it" lacks "$work/peer-off.yaml" \
    'peers=|UCX_|endPort|kind: NetworkPolicy'
  for r in 7444 a-b 70000-70001 0-10 7444-7459-7460; do
    expect_fail "schema: UCX port range $r" 'portRange.*[Dd]oes not match pattern' \
      "$helm" template wc "$chart" --set-string "peerFill.ucx.portRange=$r"
  done
  expect_fail "schema: UCX port range a number" 'portRange.*([Ii]nvalid type|want string)' \
    "$helm" template wc "$chart" --set peerFill.ucx.portRange=7444
  expect_fail "UCX port range reversed" 'portRange "7459-7444": the first port is above the last' \
    "$helm" template wc "$chart" --set peerFill.enabled=true,peerFill.ucx.portRange=7459-7444
  expect_fail "UCX port range holding the peer port" 'holds peerFill.port \(7443\)' \
    "$helm" template wc "$chart" --set peerFill.enabled=true,peerFill.ucx.portRange=7440-7450
  expect_fail "UCX port range holding the metrics port" 'holds metrics.port \(9464\)' \
    "$helm" template wc "$chart" --set peerFill.enabled=true,peerFill.ucx.portRange=9460-9470
  expect_fail "schema: peer port cap 0" 'maxConnections' \
    "$helm" template wc "$chart" --set peerFill.maxConnections=0
  expect_fail "schema: peer handshake deadline 0" 'handshakeTimeoutMs' \
    "$helm" template wc "$chart" --set peerFill.handshakeTimeoutMs=0
  expect_fail "schema: peers without a port" 'peers.*[Dd]oes not match pattern' \
    "$helm" template wc "$chart" --set-string peerFill.peers=gpu-b
  expect_fail "schema: UCX transports" 'transports.*[Dd]oes not match pattern' \
    "$helm" template wc "$chart" --set-string 'peerFill.ucx.transports=rc tcp'
  pc="$work/peer-certmanager.yaml"
  "$helm" template wc "$chart" --namespace wc --set peerFill.enabled=true,peerFill.certManager.enabled=true \
    >"$pc" 2>"$work/err" || bad "template peer cert-manager: $(cat "$work/err")"
  expect "peer cert-manager: CA Certificate" after <(doc "$pc" Certificate) 'name: wc-weightcache-peer-ca$' 10 'isCA: true'
  expect "peer cert-manager: leaf for both uses" after <(doc "$pc" Certificate) 'usages:' 2 'client auth'
  expect "peer cert-manager: CA Issuer" after <(doc "$pc" Issuer) '^  ca:$' 1 'secretName: wc-weightcache-peer-ca$'
  expect "peer cert-manager: no chart Secret" lacks "$pc" '^kind: Secret$'
  expect_fail "schema: peer port" 'port' "$helm" template wc "$chart" --set peerFill.port=70000

  # Offline Kubernetes schema validation of everything rendered.
  if [[ -n "$validator" ]]; then
    expect "kubernetes schemas" node "$validator" "$tools/node" "$d" "$m" "$work/nodp.yaml" "$gd" \
      "$w" "$c" "$work/cm-issuer.yaml" "$pc" "$pd" "$po" "$root/deploy/weightcache.yaml" "$root/deploy/examples/engine-pod.yaml"
  fi

  # The plain manifests are what this helm renders now.
  expect "deploy/weightcache.yaml up to date" env HELM="$helm" "$root/scripts/render-deploy.sh" --check
done

# The engine-pod example states the contract.
e="$root/deploy/examples/engine-pod.yaml"
tag=example
expect "example: model annotation" has "$e" '^    weightcache\.io/model: '
expect "example: WEIGHTCACHE_MODEL" after "$e" 'name: WEIGHTCACHE_MODEL$' 3 "fieldPath: metadata\.annotations\['weightcache\.io/model'\]"
expect "example: resource request" has "$e" '^          weightcache\.io/client: 1$'
expect "example: no hostPath" lacks "$e" '^[[:space:]]*hostPath:'

echo "helm-test: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
