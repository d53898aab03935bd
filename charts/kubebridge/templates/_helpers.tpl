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

{{/* kubebridge.selectorString: a dict of labels as a label selector, k=v,... sorted. */}}
{{- define "kubebridge.selectorString" -}}
{{- $terms := list -}}
{{- range $k, $v := . }}{{ $terms = append $terms (printf "%s=%s" $k $v) }}{{ end -}}
{{- join "," $terms -}}
{{- end -}}

{{/* The config file, as the bridge reads it. */}}
{{- define "kubebridge.config" -}}
{{- $cfg := merge (dict "apiVersion" "kubebridge.io/v1alpha1" "kind" "BridgeConfig") (deepCopy .Values.config) -}}
{{- if gt (int ((.Values.sharding | default dict).shards | default 0)) 0 -}}
{{- $_ := set $cfg "sharding" (dict "shards" (int .Values.sharding.shards) "key" (.Values.sharding.key | default "uid")) -}}
{{- end -}}
{{ toYaml $cfg }}
{{- end -}}

{{/* kubebridge.sharded is "true" when sharding.shards > 0 or the config sets sharding, else empty. */}}
{{- define "kubebridge.sharded" -}}
{{- if or (gt (int ((.Values.sharding | default dict).shards | default 0)) 0) ((.Values.config | default dict).sharding) }}true{{ end -}}
{{- end -}}

{{/*
kubebridge.checkSharding fails the render when sharding cannot keep its
promise: each shard's views must be readable by whichever replica owns it
next (a NATS KV every replica reaches).
*/}}
{{- define "kubebridge.checkSharding" -}}
{{- if include "kubebridge.sharded" . -}}
{{- $kind := include "kubebridge.checkpointKind" . -}}
{{- if ne $kind "natsKV" -}}
{{- fail (printf "sharding (%d shards) needs config.checkpoint.natsKV on a NATS server every replica reaches (a nats sink with a url, not embedded): each shard's acknowledged views must be readable by whichever replica owns the shard next; the checkpoint is %s" (int (dig "sharding" "shards" (.Values.sharding.shards | default 0) (.Values.config | default dict))) $kind) -}}
{{- end -}}
{{- if and (.Values.config | default dict).sharding (gt (int ((.Values.sharding | default dict).shards | default 0)) 0) -}}
{{- fail "sharding is set twice: in the chart's sharding values and in config.sharding; keep one" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Lease the replicas share (--leader-elect-name). */}}
{{- define "kubebridge.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (include "kubebridge.name" .) -}}
{{- end -}}

{{/*
kubebridge.access: the RBAC the rules need, per resource and scope, as JSON:
  {"cluster": {"<group>": ["<resource>", ...]},
   "namespaces": {"<ns>": {"<group>": ["<resource>", ...]}},
   "namespaceList": bool,
   "clusterSecrets": [{"rule": "rules[<i>] (<name>)", "selector": "<its namespaceSelector>"}, ...],
   "clusterScopedWithNamespaces": ["rules[<i>] (<name>): <resource>", ...]}
A rule is cluster-wide when it names no namespaces: it watches all of them,
and so does a namespaceSelector rule (the namespaces it selects change at run
time; the bridge lists and watches the resource in every namespace and
filters). A cluster-scoped resource has no namespaces either. Its resource
goes into "cluster" (the ClusterRole). A rule that names its namespaces puts
its resource into each of those namespaces only (a Role there): one rule's
scope never widens another's. "namespaceList" is set when a rule reads
namespaces' labels, by a namespaceSelector or a route reading namespaceLabels
(the bridge then lists and watches namespaces).
*/}}
{{- define "kubebridge.access" -}}
{{- $cluster := dict -}}
{{- $namespaces := dict -}}
{{- $nsList := false -}}
{{- $clusterSecrets := list -}}
{{- $clusterScopedWithNamespaces := list -}}
{{- $clusterScoped := include "kubebridge.clusterScopedResources" . | fromJson -}}
{{- range $i, $r := .Values.config.rules -}}
{{- $parts := splitList "/" (toString $r.resource) -}}
{{- $group := "" -}}{{- $res := last $parts -}}
{{- if eq (len $parts) 3 }}{{ $group = first $parts }}{{ end -}}
{{- if or $r.namespaceSelector (and $r.route (contains "namespaceLabels" (toString (($r.route | default dict).sink)))) }}{{ $nsList = true }}{{ end -}}
{{- if or (not $r.namespaces) $r.namespaceSelector -}}
{{- $_ := set $cluster $group (append (get $cluster $group | default list) $res | uniq | sortAlpha) -}}
{{- if and (eq $group "") (eq $res "secrets") -}}
{{- $clusterSecrets = append $clusterSecrets (dict "rule" (printf "rules[%d] (%s)" $i (toString $r.name)) "selector" (toString ($r.namespaceSelector | default ""))) -}}
{{- end -}}
{{- else -}}
{{- if has $res (get $clusterScoped $group | default list) -}}
{{- $clusterScopedWithNamespaces = append $clusterScopedWithNamespaces (printf "rules[%d] (%s): %s" $i (toString $r.name) (toString $r.resource)) -}}
{{- end -}}
{{- range $r.namespaces -}}
{{- $ns := get $namespaces . | default dict -}}
{{- $_ := set $ns $group (append (get $ns $group | default list) $res | uniq | sortAlpha) -}}
{{- $_ := set $namespaces . $ns -}}
{{- end -}}
{{- end -}}
{{- /* include: [owners]: the owners' resources, in the rule's scope (a built-in
cluster-scoped one, such as the Nodes that own mirror Pods, cluster-wide) */ -}}
{{- range $o := include "kubebridge.ownerResources" $r | fromJsonArray -}}
{{- $og := index $o 0 -}}{{- $or := index $o 1 -}}
{{- if or (not $r.namespaces) $r.namespaceSelector (has $or (get $clusterScoped $og | default list)) -}}
{{- $_ := set $cluster $og (append (get $cluster $og | default list) $or | uniq | sortAlpha) -}}
{{- else -}}
{{- range $r.namespaces -}}
{{- $ns := get $namespaces . | default dict -}}
{{- $_ := set $ns $og (append (get $ns $og | default list) $or | uniq | sortAlpha) -}}
{{- $_ := set $namespaces . $ns -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "cluster" $cluster "namespaces" $namespaces "namespaceList" $nsList "clusterSecrets" $clusterSecrets "clusterScopedWithNamespaces" $clusterScopedWithNamespaces) -}}
{{- end -}}

{{/*
kubebridge.ownerResources: the resources a rule that includes owners reads
them from, as a JSON list of [group, resource]: the built-in owners of its
resource up to their top controllers (internal/owners Needs: the same table,
TestChartOwnerRBAC holds them equal) and its ownerResources; [] for a rule
without include: [owners]. The bridge lists and watches their metadata in
the rule's namespaces (all of them for a rule that names none).
*/}}
{{- define "kubebridge.ownerResources" -}}
{{- $r := . -}}
{{- $out := list -}}
{{- if has "owners" ($r.include | default list) -}}
{{- $parts := splitList "/" (toString $r.resource) -}}
{{- $group := "" -}}{{- $res := last $parts -}}
{{- if eq (len $parts) 3 }}{{ $group = first $parts }}{{ end -}}
{{- $workloads := list (list "apps" "replicasets") (list "apps" "deployments") (list "apps" "statefulsets") (list "apps" "daemonsets") (list "batch" "jobs") (list "batch" "cronjobs") -}}
{{- if and (eq $res "events") (or (and (eq $group "") (eq (first $parts) "v1")) (eq $group "events.k8s.io")) -}}
{{- $out = prepend $workloads (list "" "pods") -}}
{{- else if and (eq $group "") (eq $res "pods") -}}
{{- $out = $workloads -}}
{{- else if and (eq $group "apps") (eq $res "replicasets") -}}
{{- $out = list (list "apps" "deployments") -}}
{{- else if and (eq $group "apps") (eq $res "controllerrevisions") -}}
{{- $out = list (list "apps" "statefulsets") (list "apps" "daemonsets") -}}
{{- else if and (eq $group "batch") (eq $res "jobs") -}}
{{- $out = list (list "batch" "cronjobs") -}}
{{- end -}}
{{- range $r.ownerResources -}}
{{- $p := splitList "/" (toString .) -}}
{{- if eq (len $p) 3 }}{{ $out = append $out (list (first $p) (last $p)) }}{{ else }}{{ $out = append $out (list "" (last $p)) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
Built-in cluster-scoped resources, by group: a rule on one of them cannot
name namespaces (a Role cannot grant them). CRDs are checked by the bridge
at start (discovery).
*/}}
{{- define "kubebridge.clusterScopedResources" -}}
{{- toJson (dict
  "" (list "namespaces" "nodes" "persistentvolumes" "componentstatuses")
  "rbac.authorization.k8s.io" (list "clusterroles" "clusterrolebindings")
  "storage.k8s.io" (list "storageclasses" "csidrivers" "csinodes" "volumeattachments")
  "apiextensions.k8s.io" (list "customresourcedefinitions")
  "apiregistration.k8s.io" (list "apiservices")
  "admissionregistration.k8s.io" (list "mutatingwebhookconfigurations" "validatingwebhookconfigurations" "validatingadmissionpolicies" "validatingadmissionpolicybindings" "mutatingadmissionpolicies" "mutatingadmissionpolicybindings")
  "scheduling.k8s.io" (list "priorityclasses")
  "node.k8s.io" (list "runtimeclasses")
  "certificates.k8s.io" (list "certificatesigningrequests")
  "flowcontrol.apiserver.k8s.io" (list "flowschemas" "prioritylevelconfigurations")
  "networking.k8s.io" (list "ingressclasses")) -}}
{{- end -}}

{{/*
kubebridge.checkRBAC fails the render when the rules would need more than the
chart grants without being asked: Secrets in every namespace (list/watch on
Secrets returns their data, so that is every Secret of the cluster) unless
rbac.allowClusterWideSecrets=true, and namespaces on a cluster-scoped
resource.
*/}}
{{- define "kubebridge.checkRBAC" -}}
{{- $access := include "kubebridge.access" . | fromJson -}}
{{- if and $access.clusterSecrets (not (dig "allowClusterWideSecrets" false (.Values.rbac | default dict))) -}}
{{- $rules := list -}}{{- $selectors := list -}}
{{- range $access.clusterSecrets -}}
{{- $rules = append $rules .rule -}}
{{- if .selector }}{{ $selectors = append $selectors (printf "%s has namespaceSelector %q" .rule .selector) }}{{ end -}}
{{- end -}}
{{- $why := "" -}}
{{- if $selectors -}}
{{- $why = printf " (%s: a namespaceSelector does not narrow RBAC, the bridge lists and watches Secrets in all namespaces and picks the selected ones itself)" (join ", " $selectors) -}}
{{- end -}}
{{- fail (printf "%s %s Secrets in every namespace: that lets kubebridge read every Secret of the cluster%s. Name the namespaces, or set rbac.allowClusterWideSecrets=true" (join " and " $rules) (ternary "watch" "watches" (gt (len $rules) 1)) $why) -}}
{{- end -}}
{{- if $access.clusterScopedWithNamespaces -}}
{{- fail (printf "%s is cluster-scoped; a rule on it cannot name namespaces (remove them: the rule then watches the whole resource)" (join "; " $access.clusterScopedWithNamespaces)) -}}
{{- end -}}
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
{{- if and .Values.leaderElection.enabled (gt $replicas 1) (not (include "kubebridge.sharded" .)) -}}
{{- $kind := include "kubebridge.checkpointKind" . -}}
{{- if eq $kind "file" -}}
{{- fail (printf "leaderElection.enabled=true with replicas=%d needs a checkpoint every replica reads: with the file checkpoint on %s, a new leader starts from an empty checkpoint and never delivers the objects deleted during the handover as deleted. Set config.checkpoint.natsKV (sink: <a nats sink>, bucket: kubebridge), or persistence.enabled=true with persistence.accessMode=ReadWriteMany (a volume every node mounts), or replicas=1" $replicas (ternary "a ReadWriteOnce PVC" "an emptyDir" (.Values.persistence.enabled | default false))) -}}
{{- else if eq $kind "natsKV-embedded" -}}
{{- fail (printf "leaderElection.enabled=true with replicas=%d needs a checkpoint every replica reads: config.checkpoint.natsKV.sink %q runs an embedded nats-server, whose KV bucket lives inside each pod. Point that sink at a NATS server all replicas reach (nats.url, embedded: false), or set replicas=1" $replicas (toString (dig "checkpoint" "natsKV" "sink" "" .Values.config))) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
kubebridge.dataVolume: what the data directory (/var/lib/kubebridge: the file
checkpoint, an embedded nats-server's store) is mounted from: "pvc" when
persistence is enabled and the checkpoint may live there (the file, or the KV
of an embedded nats-server), "emptyDir" otherwise (persistence disabled, or
the KV checkpoint on a NATS server outside the pod: the directory then only
holds scratch files).
*/}}
{{- define "kubebridge.dataVolume" -}}
{{- if and .Values.persistence.enabled (ne (include "kubebridge.checkpointKind" .) "natsKV") -}}
pvc
{{- else -}}
emptyDir
{{- end -}}
{{- end -}}

{{/*
kubebridge.strategy: the Deployment's update strategy. On a PVC that one pod
mounts at a time (ReadWriteOnce), or without leader election (nothing keeps
two pods from opening the checkpoint), the old pod must stop (drain, write
its checkpoint, release the volume) before the new one starts: Recreate.
Otherwise the pods roll and the Lease keeps one delivering.
*/}}
{{- define "kubebridge.strategy" -}}
{{- if and (eq (include "kubebridge.dataVolume" .) "pvc") (or (ne (toString .Values.persistence.accessMode) "ReadWriteMany") (not (or .Values.leaderElection.enabled (include "kubebridge.sharded" .)))) -}}
Recreate
{{- else -}}
RollingUpdate
{{- end -}}
{{- end -}}

{{/*
kubebridge.credentialDirs: the directories credential files may be read from
(--credential-dirs): every secretMounts mountPath, then credentialDirs, each
once. Empty: the flag is not passed (the bridge's default applies). A
directory inside the service-account directory fails the render, as the
bridge would refuse it.
*/}}
{{- define "kubebridge.credentialDirs" -}}
{{- $dirs := list -}}
{{- range .Values.secretMounts }}{{ $dirs = append $dirs (toString .mountPath | trimSuffix "/") }}{{ end -}}
{{- range .Values.credentialDirs }}{{ $dirs = append $dirs (toString . | trimSuffix "/") }}{{ end -}}
{{- range $d := $dirs -}}
{{- range $sa := list "/var/run/secrets/kubernetes.io/serviceaccount" "/run/secrets/kubernetes.io/serviceaccount" -}}
{{- if or (eq $d $sa) (hasPrefix (printf "%s/" $sa) $d) -}}
{{- fail (printf "credential directory %q is in the service-account directory %s, whose token would let whoever edits the config read what the bridge may read: mount credentials elsewhere (secretMounts, credentialDirs)" $d $sa) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $dirs | uniq | join "," -}}
{{- end -}}

{{/*
kubebridge.checkCheckpointFile fails the render when config.checkpoint.file
is not on the data volume: the root filesystem is read-only, and /tmp is an
emptyDir that a new pod does not keep.
*/}}
{{- define "kubebridge.checkCheckpointFile" -}}
{{- $file := dig "checkpoint" "file" "" (.Values.config | default dict) | toString -}}
{{- if and $file (not (hasPrefix "/var/lib/kubebridge/" (clean $file))) -}}
{{- fail (printf "config.checkpoint.file %q is not on the data volume: put it under /var/lib/kubebridge/ (persistence), or leave it out (default /var/lib/kubebridge/state.db)" $file) -}}
{{- end -}}
{{- end -}}
