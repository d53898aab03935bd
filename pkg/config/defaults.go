package config

import "time"

// Defaults, named so that docs and code agree.
const (
	DefaultCheckpointFile  = "/var/lib/kubebridge/state.db"
	DefaultKVBucket        = "kubebridge"
	DefaultQueueCapacity   = 10000
	DefaultInitialInterval = 200 * time.Millisecond
	DefaultMaxInterval     = 30 * time.Second
	DefaultSubject         = "k8s.{cluster}.{group}.{resource}.{namespace}.{name}.{type}"
	DefaultWebhookTimeout  = 5 * time.Second
	DefaultWebhookMode     = "binary"
	DefaultBatchMaxEvents  = 100
	DefaultBatchMaxWait    = 50 * time.Millisecond
	DefaultFileMaxSizeMB   = 100
	DefaultFileMaxBackups  = 5
)

// Event types a rule can deliver, and what its data can include.
var (
	EventTypes    = []string{"added", "updated", "deleted"}
	IncludeFields = []string{"object", "oldObject", "patch", "metadata"}
)

func (c *Config) SetDefaults() {}

// applyLateDefaults sets defaults that depend on what the file set.
func (c *Config) applyLateDefaults() {
	if c.Checkpoint.File == "" && c.Checkpoint.NATSKV == nil {
		c.Checkpoint.File = DefaultCheckpointFile
	}
}

func (k *NATSKVCheckpoint) SetDefaults() { k.Bucket = DefaultKVBucket }

func (st *Stream) SetDefaults() {
	st.Storage = "file"
	st.DuplicateWindow = Duration(2 * time.Minute)
}

func (s *Sink) SetDefaults() {
	s.Workers = 1
	s.Queue.Capacity = DefaultQueueCapacity
	s.Retry.InitialInterval = Duration(DefaultInitialInterval)
	s.Retry.MaxInterval = Duration(DefaultMaxInterval)
}

func (n *NATSSink) SetDefaults() { n.Subject = DefaultSubject }

func (w *WebhookSink) SetDefaults() {
	w.Mode = DefaultWebhookMode
	w.Timeout = Duration(DefaultWebhookTimeout)
}

func (b *Batch) SetDefaults() {
	b.MaxEvents = DefaultBatchMaxEvents
	b.MaxWait = Duration(DefaultBatchMaxWait)
}

func (f *FileSink) SetDefaults() {
	f.MaxSizeMB = DefaultFileMaxSizeMB
	f.MaxBackups = DefaultFileMaxBackups
}

func (r *Rule) SetDefaults() {
	r.Events = append([]string(nil), EventTypes...)
	r.Include = []string{"object"}
}
