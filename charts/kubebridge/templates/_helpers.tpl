{{- define "kubebridge.name" -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}

{{- define "kubebridge.labels" -}}
app.kubernetes.io/name: kubebridge
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "kubebridge.selector" -}}
app.kubernetes.io/name: kubebridge
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The config file, as the bridge reads it. */}}
{{- define "kubebridge.config" -}}
{{- $cfg := merge (dict "apiVersion" "kubebridge.io/v1alpha1" "kind" "BridgeConfig") (deepCopy .Values.config) -}}
{{ toYaml $cfg }}
{{- end -}}

{{/*
kubebridge.access: the RBAC the rules need, as JSON:
{"cluster": {"<group>": ["<resource>", ...]}, "namespaces": {"<ns>": {"<group>": [...]}}, "namespaceList": bool}
Every rule needs list and watch on its resource: in its namespaces when
every rule names namespaces, cluster-wide otherwise.
*/}}
{{- define "kubebridge.access" -}}
{{- $allNamespaced := true -}}
{{- range .Values.config.rules -}}
{{- if not .namespaces }}{{ $allNamespaced = false }}{{ end -}}
{{- end -}}
{{- $cluster := dict -}}
{{- $namespaces := dict -}}
{{- $nsList := false -}}
{{- range .Values.config.rules -}}
{{- $parts := splitList "/" .resource -}}
{{- $group := "" -}}{{- $res := last $parts -}}
{{- if eq (len $parts) 3 }}{{ $group = first $parts }}{{ end -}}
{{- if .namespaceSelector }}{{ $nsList = true }}{{ end -}}
{{- if $allNamespaced -}}
{{- range .namespaces -}}
{{- $ns := get $namespaces . | default dict -}}
{{- $_ := set $ns $group (append (get $ns $group | default list) $res | uniq | sortAlpha) -}}
{{- $_ := set $namespaces . $ns -}}
{{- end -}}
{{- else -}}
{{- $_ := set $cluster $group (append (get $cluster $group | default list) $res | uniq | sortAlpha) -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "cluster" $cluster "namespaces" $namespaces "namespaceList" $nsList) -}}
{{- end -}}
