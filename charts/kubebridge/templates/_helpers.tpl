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

{{/*
kubebridge.checkpointKind: where the checkpoint lives, as the replicas see it:
"natsKV" (a NATS server every replica reaches), "natsKV-embedded" (the KV of
a nats-server embedded in each pod: per pod), "file-shared" (the file on a
ReadWriteMany PVC) or "file" (an emptyDir or a ReadWriteOnce PVC: per pod).
*/}}
{{- define "kubebridge.checkpointKind" -}}
{{- $kv := dig "checkpoint" "natsKV" nil (.Values.config | default dict) -}}
{{- if $kv -}}
{{- $embedded := false -}}
{{- range .Values.config.sinks -}}
{{- if and (kindIs "map" .) (eq (toString .name) (toString $kv.sink)) (kindIs "map" .nats) -}}
{{- if .nats.embedded }}{{ $embedded = true }}{{ end -}}
{{- end -}}
{{- end -}}
{{- if $embedded }}natsKV-embedded{{ else }}natsKV{{ end -}}
{{- else if and .Values.persistence.enabled (eq (toString .Values.persistence.accessMode) "ReadWriteMany") -}}
file-shared
{{- else -}}
file
{{- end -}}
{{- end -}}

{{/*
kubebridge.checkLeaderElection fails the render when several replicas share a
Lease but not the checkpoint: a new leader would reconcile against an empty
checkpoint and never deliver the objects deleted during the handover.
*/}}
{{- define "kubebridge.checkLeaderElection" -}}
{{- $replicas := int .Values.replicas -}}
{{- if and .Values.leaderElection.enabled (gt $replicas 1) -}}
{{- $kind := include "kubebridge.checkpointKind" . -}}
{{- if eq $kind "file" -}}
{{- fail (printf "leaderElection.enabled=true with replicas=%d needs a checkpoint every replica reads: with the file checkpoint on %s, a new leader starts from an empty checkpoint and never delivers the objects deleted during the handover as deleted. Set config.checkpoint.natsKV (sink: <a nats sink>, bucket: kubebridge), or persistence.enabled=true with persistence.accessMode=ReadWriteMany (a volume every node mounts), or replicas=1" $replicas (ternary "a ReadWriteOnce PVC" "an emptyDir" (.Values.persistence.enabled | default false))) -}}
{{- else if eq $kind "natsKV-embedded" -}}
{{- fail (printf "leaderElection.enabled=true with replicas=%d needs a checkpoint every replica reads: config.checkpoint.natsKV.sink %q runs an embedded nats-server, whose KV bucket lives inside each pod. Point that sink at a NATS server all replicas reach (nats.url, embedded: false), or set replicas=1" $replicas (toString (dig "checkpoint" "natsKV" "sink" "" .Values.config))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
