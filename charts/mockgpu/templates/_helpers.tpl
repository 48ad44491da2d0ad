{{/* The chart's name, or nameOverride. */}}
{{- define "mockgpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of object names: fullnameOverride, or <release>-<name> (the release alone when it contains the name). */}}
{{- define "mockgpu.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := include "mockgpu.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "mockgpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "mockgpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels; (dict "root" $ "component" "agent"). */}}
{{- define "mockgpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mockgpu.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* An image reference; (dict "root" $ "image" .Values.agent.image). */}}
{{- define "mockgpu.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{- define "mockgpu.agentServiceAccount" -}}
{{- default (printf "%s-agent" (include "mockgpu.fullname" .)) .Values.agent.serviceAccount.name }}
{{- end }}

{{/* CEL of the admission policies: the node named by the requester's pod-bound token (its
authentication.kubernetes.io/node-name claim), or '' without one. */}}
{{- define "mockgpu.nodeNameClaim" -}}
has(request.userInfo.extra) && 'authentication.kubernetes.io/node-name' in request.userInfo.extra && size(request.userInfo.extra['authentication.kubernetes.io/node-name']) > 0 ? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''
{{- end }}

{{- define "mockgpu.controllerServiceAccount" -}}
{{- default (printf "%s-controller" (include "mockgpu.fullname" .)) .Values.controller.serviceAccount.name }}
{{- end }}

{{/* The profile of a pool: its own when set and not empty, else agent.profile. */}}
{{- define "mockgpu.poolProfile" -}}
{{- $p := .pool.profile | default dict }}
{{- if not (or $p.name $p.file (($p.configMap | default dict).name)) }}
{{- $p = .root.Values.agent.profile }}
{{- end }}
{{- if and $p.file (($p.configMap | default dict).name) }}
{{- fail (printf "agent pool %q: the profile sets both file and configMap.name; set one" .pool.name) }}
{{- end }}
{{- toJson $p }}
{{- end }}

{{/* The ConfigMap of a pool's inline profile (profile.file). */}}
{{- define "mockgpu.profileConfigMap" -}}
{{- printf "%s-profile-%s" (include "mockgpu.fullname" .root) .pool.name }}
{{- end }}

{{/* The DRA drivers a pool runs, as JSON {"gpus": bool, "computeDomains": bool}; (dict "root" $
"pool" $pool): agent.dra's, each overridden by the pool's own `dra`. */}}
{{- define "mockgpu.poolDra" -}}
{{- $d := dict "gpus" .root.Values.agent.dra.gpus "computeDomains" .root.Values.agent.dra.computeDomains }}
{{- range $k, $v := (.pool.dra | default dict) }}{{ $_ := set $d $k $v }}{{ end }}
{{- toJson $d }}
{{- end }}

{{/* "true" when some pool runs the DRA drivers, else empty. Fails on a Kubernetes older than
1.34, which has no resource.k8s.io/v1. */}}
{{- define "mockgpu.draAnywhere" -}}
{{- $root := . }}
{{- $on := false }}
{{- range .Values.agent.pools }}
{{- $d := include "mockgpu.poolDra" (dict "root" $root "pool" .) | fromJson }}
{{- if or $d.gpus $d.computeDomains }}{{ $on = true }}{{ end }}
{{- end }}
{{- if $on }}
{{- if semverCompare "<1.34.0-0" .Capabilities.KubeVersion.Version }}
{{- fail (printf "agent.dra: DRA needs Kubernetes 1.34 or later (resource.k8s.io/v1), this is %s" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- "true" }}
{{- end }}
{{- end }}
