{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "weightcache.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release name already holds the chart name. */}}
{{- define "weightcache.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "weightcache.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "weightcache.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weightcache.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "weightcache.labels" -}}
helm.sh/chart: {{ include "weightcache.chart" . }}
{{ include "weightcache.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-daemon
{{- end }}

{{- define "weightcache.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "weightcache.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "weightcache.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The models file: `models:` and one spec per values entry, version defaulting to 1. */}}
{{- define "weightcache.modelsYaml" -}}
{{- $specs := list }}
{{- range .Values.models }}
{{- $specs = append $specs (merge (dict) . (dict "version" 1)) }}
{{- end }}
{{- dict "models" $specs | toYaml }}
{{- end }}

{{/* Whether the cluster serves the prometheus-operator CRDs. */}}
{{- define "weightcache.hasMonitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/* Labels of the webhook's objects (templates/webhook.yaml). */}}
{{- define "weightcache.webhookLabels" -}}
helm.sh/chart: {{ include "weightcache.chart" . }}
app.kubernetes.io/name: {{ include "weightcache.name" . }}-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: webhook
{{- end }}
