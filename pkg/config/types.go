package config

import "math"

// APIVersion and Kind identify a kubebridge config document.
const (
	APIVersion = "kubebridge.io/v1alpha1"
	Kind       = "BridgeConfig"
)

// Config is a whole kubebridge config file (apiVersion kubebridge.io/v1alpha1).
type Config struct {
	// APIVersion must be kubebridge.io/v1alpha1.
	APIVersion string `yaml:"apiVersion"`
	// Kind must be BridgeConfig.
	Kind string `yaml:"kind"`
	// Cluster names this cluster; it is stamped on every event (source, kbcluster, the NATS subject). Required.
	Cluster string `yaml:"cluster"`
	// Checkpoint says where each sink's delivered state is kept.
	Checkpoint Checkpoint `yaml:"checkpoint"`
	// Sinks are the destinations events are delivered to. At least one.
	Sinks []Sink `yaml:"sinks"`
	// Rules select objects and name the sinks their changes go to. At least one.
	Rules []Rule `yaml:"rules"`
	// Redaction says what of a Secret never leaves the cluster (with its data and stringData).
	Redaction Redaction `yaml:"redaction"`
	// Sharding splits the watched objects into shards that replicas share, each delivered by one replica at a time (docs/sharding.md). Requires checkpoint.natsKV. Default: off (the bridge, or its one leader, delivers every object).
	Sharding *Sharding `yaml:"sharding"`

	lines map[string]int // key path -> line in the file it was loaded from
	file  string         // the file it was loaded from (Load)
}

// LineOf returns the line in the config file of a key path such as
// rules[1].resource (or of its closest ancestor), or 0 when unknown.
func (c *Config) LineOf(path string) int {
	if c.lines == nil {
		return 0
	}
	return lineOf(c.lines, path)
}

// Redaction lists what is redacted in Secret events besides data and stringData.
type Redaction struct {
	// SecretAnnotations are more Secret annotations whose values are redacted, besides kubectl.kubernetes.io/last-applied-configuration and openshift.io/token-secret.value, which hold the Secret's values and are always redacted; "*" redacts every annotation.
	SecretAnnotations []string `yaml:"secretAnnotations"`
}

// Sharding splits the objects into N virtual shards by a 64-bit FNV-1a hash of their uid or namespace (the apiserver's KEP-5866 hash); each shard is owned through its own Lease, and live replicas share the shards evenly.
type Sharding struct {
	// Shards is the number of virtual shards, 1 to 256, fixed for the life of the checkpoint bucket: each shard's acknowledged views are kept under its own keys. More shards than replicas lets a change of replicas move load in small steps.
	Shards int `yaml:"shards"`
	// Key is what an object's shard is computed from: uid (default; spreads objects evenly) or namespace (keeps a namespace's objects on one replica; cluster-scoped objects all land in one shard).
	Key string `yaml:"key"`
}

// Checkpoint selects the store for per-sink delivered state. Exactly one of file and natsKV; file when neither is set.
type Checkpoint struct {
	// File is the path of a bbolt file. Default /var/lib/kubebridge/state.db when natsKV is not set.
	File string `yaml:"file"`
	// NATSKV keeps the state in a NATS JetStream key-value bucket, so another replica can take over.
	NATSKV *NATSKVCheckpoint `yaml:"natsKV"`
}

// NATSKVCheckpoint stores checkpoints in a JetStream KV bucket reached through a NATS sink's connection.
type NATSKVCheckpoint struct {
	// Sink names the nats sink whose connection is used. Required.
	Sink string `yaml:"sink"`
	// Bucket is the KV bucket name. Default kubebridge.
	Bucket string `yaml:"bucket"`
}

// Sink is one destination: the settings every sink has, and one type block
// (nats:, webhook:, file:, exec:, ...) whose key selects the sink type and
// whose content is that type's own config (see SinkTypes).
type Sink struct {
	// Name identifies the sink in rules, metrics and logs. Required, unique, a DNS-1123 label.
	Name string `yaml:"name"`
	// Type is the sink type: the key of its type block (nats, webhook, file, exec, ...). Set by the loader.
	Type string `yaml:"-"`
	// Spec is the type block decoded into that type's config (a pointer from its factory's NewConfig). Set by the loader.
	Spec any `yaml:"-"`
	// Queue bounds the sink's pending events.
	Queue Queue `yaml:"queue"`
	// Retry sets the backoff between delivery attempts.
	Retry Retry `yaml:"retry"`
	// ReplayEvery replays the full state of every rule view to this sink at this period (resync). Default 0: never.
	ReplayEvery Duration `yaml:"replayEvery"`
	// Concurrency bounds how many batches are in flight at once: the number adapts between 1 and max, growing while the destination's round-trip times stay flat and shrinking when they rise or it pushes back (429, 503, timeouts). An object is never in two batches at once. Not with workers.
	Concurrency *Concurrency `yaml:"concurrency"`
	// Workers fixes how many batches are in flight at once (1 to 256), instead of adapting it (concurrency). Default 0: adaptive.
	Workers int `yaml:"workers"`
	// DeadLetter receives events the sink refused permanently (e.g. HTTP 400), with the error. Default: logged and counted only.
	DeadLetter *DeadLetter `yaml:"deadLetter"`
	// RateLimit holds the events sent to the sink to a rate, dropping none: what waits stays queued, in order, coalescing per object past the queue's capacity. Default: no limit.
	RateLimit *RateLimit `yaml:"rateLimit"`
	// UpdateWindow holds messages back to one per window: a duration (`updateWindow: 30s`) is one per object, or `{every: 10m, key: <CEL>}` one per key (docs/actions.md). Default: every update.
	UpdateWindow UpdateWindow `yaml:"updateWindow"`

	// Digest sends the sink's events once per period, one message per group, listing what entered and left the view and what changed (webhook presets slack, teams and generic render it). Not with updateWindow or rateLimit. Default: each event as it comes.
	Digest *Digest `yaml:"digest"`
	// Mute holds the sink's events during time windows (quiet hours) and sends what is still true when a window ends (as a digest where one is set); kubebridge_sink_held_events shows what waits and kubebridge_sink_withheld_total{reason="mute"} what was held; what is held is recomputed from the view at a restart. Default: never muted.
	Mute *Mute `yaml:"mute"`
}

// UpdateWindow holds a sink's messages back to one per object, or per key,
// per window. Written as a duration, it is {every: <duration>}.
type UpdateWindow struct {
	// Every is the window. Without key: at most one update per object per window; updates in between coalesce (the latest state wins); an added, a deleted and a replay are never held back or dropped. Default 0: every update.
	Every Duration `yaml:"every"`
	// Key is a CEL expression over the event (object, oldObject, type; owners and involved with include: [owners]) yielding a string, e.g. object.involvedObject.uid + '/' + object.reason: at most one message per key per window, whatever the change, the latest state of the key's objects winning (one still present over a deletion); the objects coalesced into it are recorded as delivered without a message of their own. An object keeps the key of its first event. Only on a sink that sends messages for people (a webhook with request or preset, not an alert's): a consumer applying events by uid, or an alert resolved per object, would miss the objects coalesced away. Default: per object.
	Key string `yaml:"key"`
	// MaxKeys bounds the keys waiting out a window at once (with key). Past it, a key's messages go out as they come, without a window (counted in kubebridge_sink_window_overflow_total): none is dropped or held longer. Default 10000.
	MaxKeys int `yaml:"maxKeys"`
}

// DefaultWindowMaxKeys is UpdateWindow.MaxKeys' default.
const DefaultWindowMaxKeys = 10_000

// KeysOrDefault is MaxKeys, or its default.
func (w UpdateWindow) KeysOrDefault() int {
	if w.MaxKeys > 0 {
		return w.MaxKeys
	}
	return DefaultWindowMaxKeys
}

// parseShorthand reads `updateWindow: 30s`: a window per object.
func (w *UpdateWindow) parseShorthand(s string) error { return w.Every.parseScalar(s) }

// MarshalYAML writes a window without key as its shorthand, a duration.
func (w UpdateWindow) MarshalYAML() (any, error) {
	if w.Key == "" && w.MaxKeys == 0 {
		return w.Every, nil
	}
	type plain UpdateWindow // without this method
	return plain(w), nil
}

// RateLimit is a token bucket over the events a sink is sent.
type RateLimit struct {
	// EventsPerSecond is the sustained rate (e.g. 0.5: one event every 2 s). Required.
	EventsPerSecond float64 `yaml:"eventsPerSecond"`
	// Burst is how many may go at once after a quiet spell; batches are cut to it. Default: eventsPerSecond rounded up, at least 1.
	Burst int `yaml:"burst"`
}

// BurstOrDefault is Burst, or its default.
func (r *RateLimit) BurstOrDefault() int {
	if r.Burst > 0 {
		return r.Burst
	}
	return max(1, int(math.Ceil(r.EventsPerSecond)))
}

// DeadLetter says where permanently refused events go. Exactly one of file and nats.
type DeadLetter struct {
	// File appends each refused event with its error as a JSON line. An absolute path; never the checkpoint, the config, a credential file, another sink's file or dead-letter, or under /dev, /proc, /sys; a regular file, not a link (docs/security.md).
	File string `yaml:"file"`
	// MaxSizeMB rotates the file when it reaches this size (with file). Default 100.
	MaxSizeMB int `yaml:"maxSizeMB"`
	// MaxBackups is how many rotated files are kept (with file), at most 100. Default 5.
	MaxBackups int `yaml:"maxBackups"`
	// NATS publishes each refused event, with its error in the Kubebridge-Error header, through a nats sink's connection.
	NATS *DeadLetterNATS `yaml:"nats"`
}

// DeadLetterNATS publishes refused events to a subject.
type DeadLetterNATS struct {
	// Sink names the nats sink whose connection is used. Required.
	Sink string `yaml:"sink"`
	// Subject receives the refused events. Required.
	Subject string `yaml:"subject"`
}

// Concurrency configures adaptive concurrency.
type Concurrency struct {
	// Max is the most batches in flight at once (1 to 256). Default 64.
	Max int `yaml:"max"`
}

// InFlight returns how many batches the sink may have in flight at once
// and whether the number adapts below it (false: workers fixes it).
func (s *Sink) InFlight() (limit int, adaptive bool) {
	switch {
	case s.Workers > 0:
		return s.Workers, false
	case s.Concurrency != nil && s.Concurrency.Max > 0:
		return s.Concurrency.Max, true
	}
	return DefaultConcurrencyMax, true
}

// Queue configures a sink's bounded queue.
type Queue struct {
	// Capacity is how many events are kept in order; beyond it, pending events are coalesced per object (latest state kept). Default 10000.
	Capacity int `yaml:"capacity"`
}

// Retry configures exponential backoff with jitter between delivery attempts.
type Retry struct {
	// InitialInterval is the wait after the first failure. Default 200ms.
	InitialInterval Duration `yaml:"initialInterval"`
	// MaxInterval caps the wait between attempts. Default 30s.
	MaxInterval Duration `yaml:"maxInterval"`
	// MaxElapsed gives up on an event (dead-letter) after the destination failed it for this long (time waiting for the checkpoint's write-ahead intent or the leader lease does not count). Without a deadLetter nothing is given up (the object stays parked); a destination-config failure (401, 403, 404, 410, 3xx for a target no object chose) is never given up; for a target the object chose (a path built from its name) it is that object's and is given up like any other. Default 0: retry until acknowledged.
	MaxElapsed Duration `yaml:"maxElapsed"`
}

// TLS configures a client's TLS.
type TLS struct {
	// CAFile is a PEM bundle of CAs to trust. Default: the system pool.
	CAFile string `yaml:"caFile"`
	// CertFile is the client certificate (PEM), used with keyFile.
	CertFile string `yaml:"certFile"`
	// KeyFile is the client key (PEM), used with certFile.
	KeyFile string `yaml:"keyFile"`
	// InsecureSkipVerify disables server certificate checks. Default false; never use it in production.
	InsecureSkipVerify bool `yaml:"insecureSkipVerify"`
}

// Rule selects objects of one resource and names the sinks their changes go to.
// A rule is a view: objects entering it are delivered as added, leaving it as deleted.
type Rule struct {
	// Name identifies the rule (kbrule extension, metrics, logs). Required, unique, a DNS-1123 label.
	Name string `yaml:"name"`
	// Resource is group/version/resource, e.g. apps/v1/deployments; core resources are v1/configmaps. Required.
	Resource string `yaml:"resource"`
	// Namespaces limits the rule to these namespaces. Default: all namespaces.
	Namespaces []string `yaml:"namespaces"`
	// NamespaceSelector selects namespaces by their labels, tracked live. Not with namespaces.
	NamespaceSelector string `yaml:"namespaceSelector"`
	// LabelSelector is a Kubernetes label selector, applied by the apiserver where it can be.
	LabelSelector string `yaml:"labelSelector"`
	// FieldSelector is a Kubernetes field selector, applied by the apiserver where it can be.
	FieldSelector string `yaml:"fieldSelector"`
	// Events lists the event types delivered: added, updated, deleted. Default all three.
	Events []string `yaml:"events"`
	// Index matches objects by informer index keys (namespace, label:<key>, annotation:<key>, owner:<Kind>) to any of the listed values; keys are ANDed.
	Index map[string][]string `yaml:"index"`
	// Where is a CEL expression over object, oldObject and type that must be true for the object to be in the view. It must be boolean; object.metadata is typed as Kubernetes ObjectMeta (dyn(object) treats the object as a map).
	Where string `yaml:"where"`
	// Changed delivers updates only when a value one of these paths selects changed: keys joined by dots (spec.replicas), a key with dots or slashes quoted (metadata.labels["app.kubernetes.io/name"]), a list entered with [*] (spec.template.spec.containers[*].image), [name=web] (the element whose name is web) or [0]; list elements are matched by name (else type, else position), so reordering changes nothing. A path that can never select anything (a key through a list, a field the kind does not have) fails validate against the cluster.
	Changed []string `yaml:"changed"`
	// Include lists what goes into the event data: object, oldObject, patch; or metadata alone (the object's apiVersion, kind and metadata, for consumers that fetch the rest: the bridge then caches only metadata when every rule on the resource allows it); and owners: the owner chain up to the top controller (data.owners, nearest first, each {apiVersion, kind, name, uid, labels}; the where and request templates read it as owners) and, for Kubernetes Events (v1/events, events.k8s.io/v1/events), the object the Event is about with its owners (data.involved; involved). owners adds to the others (object when it is alone). Owners are read from metadata caches the bridge keeps of the resources that own this one's objects: for pods ReplicaSets, Deployments, StatefulSets, DaemonSets, Jobs and CronJobs; for replicasets Deployments; for jobs CronJobs; for Events Pods and those; add others (CRDs) with ownerResources. An owner not cached yet of an object just changed is waited for up to 1s (only for a young object, within a budget: docs/consumers.md#owners), then named from its ownerReference without labels (data.ownersIncomplete, kubebridge_owners_incomplete_total). Default [object].
	Include []string `yaml:"include"`
	// OwnerResources are more resources (group/version/resource) whose objects may own this rule's objects or their owners, e.g. CRDs (argoproj.io/v1alpha1/rollouts), or v1/nodes (the owners of mirror Pods): the bridge caches their metadata too (a cluster-scoped one across the cluster), and the chart grants list and watch on them (a cluster-scoped CRD of a rule that names namespaces needs a ClusterRole of your own: the chart cannot tell its scope). With include: [owners].
	OwnerResources []string `yaml:"ownerResources"`
	// OwnerLabels are the labels of owners (and of an Event's involved object) the rule's events, where and templates see, e.g. [team, app.kubernetes.io/name]. With include: [owners]. Default: all of them. Naming them keeps events small, and the owners' caches too: when every rule that includes owners names its labels, the caches keep only those.
	OwnerLabels []string `yaml:"ownerLabels"`
	// Sinks names the sinks this rule delivers to. At least one.
	Sinks []string `yaml:"sinks"`
	// Route sends each object to one of sinks instead of to all of them, chosen by an expression (routing by team), e.g. {sink: "'slack-' + namespaceLabels.team", default: slack-ops}. Only the rule's sinks can be chosen, never a destination an object names. Each sink's view is the objects routed to it: when an object's route changes (its namespace relabeled) it is deleted (kbreason unmatched) from one sink and added to the other. Default: every sink.
	Route *Route `yaml:"route"`
	// AllowSecretData keeps Secret data and stringData in events. Default false: redacted.
	AllowSecretData bool `yaml:"allowSecretData"`
}

// Route chooses, per object, the one sink of its rule the object goes to, e.g. sink: "'slack-' + namespaceLabels.team" with default: slack-ops. Only the rule's own sinks can be chosen, so an object can never name a destination. Each sink's view is the objects routed to it: an object whose route changes (its namespace relabeled) is deleted from one sink and added to the other.
type Route struct {
	// Sink is a CEL expression giving a sink's name, over object, namespaceLabels (its namespace's labels, tracked live; empty for cluster-scoped objects; an object whose namespace is not known yet waits in no sink's view) and, with include: [owners], owners and involved (tracked live too: an owner's relabelling moves the objects below it), not oldObject or type. A name that is not one of the rule's sinks, an evaluation error (e.g. a missing label) or a result that is not a string sends the object to default, counted in kubebridge_rule_route_defaulted_total{rule,reason}. Required.
	Sink string `yaml:"sink"`
	// Default is where objects go when sink names none of the rule's sinks. Required; one of the rule's sinks.
	Default string `yaml:"default"`
}
