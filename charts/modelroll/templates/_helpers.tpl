{{/*
The chart name, overridable with nameOverride.
*/}}
{{- define "modelroll.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every resource name: <release>-<chart>, or the release name alone when it already
contains the chart name. Truncated so that "<fullname>-operator" stays within 63 characters.
*/}}
{{- define "modelroll.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label (never used in selectors).
*/}}
{{- define "modelroll.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every resource.
*/}}
{{- define "modelroll.labels" -}}
helm.sh/chart: {{ include "modelroll.chart" . }}
app.kubernetes.io/name: {{ include "modelroll.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: modelroll
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels of one component; call with (dict "ctx" $ "component" "gateway").
*/}}
{{- define "modelroll.selectorLabels" -}}
app.kubernetes.io/name: {{ include "modelroll.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
All labels of one component's resources; call like modelroll.selectorLabels.
*/}}
{{- define "modelroll.componentLabels" -}}
{{ include "modelroll.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
An image reference; call with (dict "image" .Values.x.image "ctx" $). The tag defaults to the
chart's appVersion.
*/}}
{{- define "modelroll.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{/*
The sidecar image the operator injects: operator.sidecarImage, else sidecar.image.
*/}}
{{- define "modelroll.sidecarImage" -}}
{{- if .Values.operator.sidecarImage }}
{{- .Values.operator.sidecarImage }}
{{- else }}
{{- include "modelroll.image" (dict "image" .Values.sidecar.image "ctx" .) }}
{{- end }}
{{- end }}

{{/*
Service account names.
*/}}
{{- define "modelroll.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "modelroll.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "modelroll.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create }}
{{- default (printf "%s-gateway" (include "modelroll.fullname" .)) .Values.gateway.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.gateway.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The labels the operator puts on every managed model pod (modelroll_operator.workload's
workload_labels), and the sidecar's port in those pods (its SIDECAR_PORT): what the
NetworkPolicy selects and admits.
*/}}
{{- define "modelroll.modelPodLabels" -}}
app.kubernetes.io/managed-by: modelroll-operator
app.kubernetes.io/component: model-server
{{- end }}

{{- define "modelroll.sidecarPort" -}}
8000
{{- end }}

{{/*
The routes ConfigMap: one per namespace, named by the contract in docs/design.md.
*/}}
{{- define "modelroll.routesConfigMap" -}}
modelroll-routes
{{- end }}

{{/*
Labels that make the Prometheus Operator (kube-prometheus-stack) select a monitoring object.
*/}}
{{- define "modelroll.monitoringLabels" -}}
{{- $labels := fromYaml (include "modelroll.labels" .) }}
{{- toYaml (merge (deepCopy .Values.monitoring.additionalLabels) $labels) }}
{{- end }}

{{/*
The writable /tmp every container gets, since root filesystems are read-only.
*/}}
{{- define "modelroll.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{- define "modelroll.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}

{{/*
The kopf peering name the operator replicas share when peering is on.
*/}}
{{- define "modelroll.peeringName" -}}
{{- include "modelroll.fullname" . }}
{{- end }}

{{/*
KEDA, when the chart installs it (autoscaling.keda.install): the names of its objects (its
operator's end in -keda: only modelroll's operator's end in -operator).
*/}}
{{- define "modelroll.keda.operator" -}}
{{- include "modelroll.fullname" . }}-keda
{{- end }}

{{- define "modelroll.keda.adapter" -}}
{{- include "modelroll.fullname" . }}-keda-adapter
{{- end }}

{{- define "modelroll.keda.certs" -}}
{{- include "modelroll.fullname" . }}-keda-certs
{{- end }}

{{/*
The environment both KEDA processes read: their namespace (where the operator keeps its
certificates and lease) and the namespaces they watch (empty: every one).
*/}}
{{- define "modelroll.keda.env" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: WATCH_NAMESPACE
  value: {{ join "," .Values.operator.watchNamespaces | quote }}
{{- end }}
