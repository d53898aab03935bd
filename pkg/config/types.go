package config

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

	lines map[string]int // key path -> line in the file it was loaded from
}

// LineOf returns the line in the config file of a key path such as
// rules[1].resource (or of its closest ancestor), or 0 when unknown.
func (c *Config) LineOf(path string) int {
	if c.lines == nil {
		return 0
	}
	return lineOf(c.lines, path)
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

// Sink is one destination. Exactly one of nats, webhook and file is set.
type Sink struct {
	// Name identifies the sink in rules, metrics and logs. Required, unique, a DNS-1123 label.
	Name string `yaml:"name"`
	// Type is the sink type: the key of its type block (nats, webhook, file, exec, ...). Set by the loader.
	Type string `yaml:"-"`
	// Spec is the type block decoded into that type's config (a pointer from its factory's NewConfig). Set by the loader.
	Spec any `yaml:"-"`
	// NATS publishes events to NATS subjects.
	NATS *NATSSink `yaml:"nats"`
	// Webhook POSTs events to an HTTP endpoint.
	Webhook *WebhookSink `yaml:"webhook"`
	// File appends events as JSON lines to a file.
	File *FileSink `yaml:"file"`
	// Queue bounds the sink's pending events.
	Queue Queue `yaml:"queue"`
	// Retry sets the backoff between delivery attempts.
	Retry Retry `yaml:"retry"`
	// ReplayEvery replays the full state of every rule view to this sink at this period (resync). Default 0: never.
	ReplayEvery Duration `yaml:"replayEvery"`
	// Workers is how many deliveries run at once; events of one object always go through the same worker, in order. Default 1.
	Workers int `yaml:"workers"`
	// DeadLetter receives events the sink refused permanently (e.g. HTTP 400), with the error. Default: logged and counted only.
	DeadLetter *DeadLetter `yaml:"deadLetter"`
}

// DeadLetter says where permanently refused events go. Exactly one of file and nats.
type DeadLetter struct {
	// File appends each refused event with its error as a JSON line.
	File string `yaml:"file"`
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
	// MaxElapsed gives up on an event (dead-letter) after retrying this long. Default 0: retry until acknowledged.
	MaxElapsed Duration `yaml:"maxElapsed"`
}

// NATSSink publishes each event to a subject built from a template.
type NATSSink struct {
	// URL is one server URL or a comma-separated list (nats://, tls://, ws://, wss://). Required unless embedded.
	URL string `yaml:"url"`
	// Embedded runs a nats-server inside the bridge (dev and single-node setups); url is then optional.
	Embedded bool `yaml:"embedded"`
	// CredentialsFile is a NATS .creds file (JWT and nkey seed).
	CredentialsFile string `yaml:"credentialsFile"`
	// NKeySeedFile is a file holding an nkey seed.
	NKeySeedFile string `yaml:"nkeySeedFile"`
	// TokenFile is a file holding an auth token.
	TokenFile string `yaml:"tokenFile"`
	// User is the user name for user/password auth; the password comes from passwordFile.
	User string `yaml:"user"`
	// PasswordFile is a file holding the password for user.
	PasswordFile string `yaml:"passwordFile"`
	// TLS configures the client's TLS.
	TLS *TLS `yaml:"tls"`
	// Subject is the subject template; placeholders {cluster} {group} {version} {resource} {kind} {namespace} {name} {type} {rule}. Default k8s.{cluster}.{group}.{resource}.{namespace}.{name}.{type}.
	Subject string `yaml:"subject"`
	// JetStream publishes with acknowledgement and Nats-Msg-Id = event id, so the stream dedupes replays. Default false: core publish, acknowledged by flush.
	JetStream bool `yaml:"jetstream"`
	// Stream, when set, is created or updated at start (dev and single-node setups); in production streams are usually managed elsewhere.
	Stream *Stream `yaml:"stream"`
}

// Stream is a JetStream stream the bridge creates or updates at start.
type Stream struct {
	// Name of the stream. Required.
	Name string `yaml:"name"`
	// Subjects the stream captures. Default: the subject template up to its first placeholder, then ">" (e.g. k8s.>).
	Subjects []string `yaml:"subjects"`
	// Storage is file or memory. Default file.
	Storage string `yaml:"storage"`
	// MaxAge drops messages older than this. Default 0: kept until other limits apply.
	MaxAge Duration `yaml:"maxAge"`
	// DuplicateWindow is how long JetStream remembers event ids to drop replays. Default 2m (the server's default).
	DuplicateWindow Duration `yaml:"duplicateWindow"`
}

// WebhookSink POSTs CloudEvents to an HTTP(S) endpoint.
type WebhookSink struct {
	// URL is the http:// or https:// endpoint. Required.
	URL string `yaml:"url"`
	// Mode is binary (ce-* headers, body = data) or structured (the whole event as JSON). Default binary; batching always uses batch mode.
	Mode string `yaml:"mode"`
	// SigningSecretFile holds the HMAC-SHA256 key for the X-Kubebridge-Signature header. Default: no signature.
	SigningSecretFile string `yaml:"signingSecretFile"`
	// BearerTokenFile holds a token sent as Authorization: Bearer. Default: none.
	BearerTokenFile string `yaml:"bearerTokenFile"`
	// Headers are added to every request.
	Headers map[string]string `yaml:"headers"`
	// Timeout bounds one request. Default 5s.
	Timeout Duration `yaml:"timeout"`
	// Batch sends several events per request (CloudEvents batch mode). Default: one event per request.
	Batch *Batch `yaml:"batch"`
	// TLS configures the client's TLS.
	TLS *TLS `yaml:"tls"`
}

// Batch bounds a batch of events sent in one request.
type Batch struct {
	// MaxEvents is the most events in one batch. Default 100.
	MaxEvents int `yaml:"maxEvents"`
	// MaxWait is how long a partial batch waits for more events. Default 50ms.
	MaxWait Duration `yaml:"maxWait"`
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

// FileSink appends events as JSON lines.
type FileSink struct {
	// Path of the file; "-" writes to stdout. Required.
	Path string `yaml:"path"`
	// MaxSizeMB rotates the file when it reaches this size. Default 100.
	MaxSizeMB int `yaml:"maxSizeMB"`
	// MaxBackups is how many rotated files are kept. Default 5.
	MaxBackups int `yaml:"maxBackups"`
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
	// Where is a CEL expression over object, oldObject and type that must be true for the object to be in the view.
	Where string `yaml:"where"`
	// Changed delivers updates only when one of these paths (e.g. spec, metadata.labels) changed.
	Changed []string `yaml:"changed"`
	// Include lists what goes into the event data: object, oldObject, patch; or metadata alone (the object's apiVersion, kind and metadata, for consumers that fetch the rest: the bridge then caches only metadata when every rule on the resource allows it). Default [object].
	Include []string `yaml:"include"`
	// Sinks names the sinks this rule delivers to. At least one.
	Sinks []string `yaml:"sinks"`
	// AllowSecretData keeps Secret data and stringData in events. Default false: redacted.
	AllowSecretData bool `yaml:"allowSecretData"`
}
