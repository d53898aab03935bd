package config

import "time"

// Defaults, named so that docs and code agree.
const (
	DefaultCheckpointFile  = "/var/lib/kubebridge/state.db"
	DefaultKVBucket        = "kubebridge"
	DefaultQueueCapacity   = 10000
	DefaultInitialInterval = 200 * time.Millisecond
	DefaultMaxInterval     = 30 * time.Second
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

func (s *Sink) SetDefaults() {
	s.Workers = 1
	s.Queue.Capacity = DefaultQueueCapacity
	s.Retry.InitialInterval = Duration(DefaultInitialInterval)
	s.Retry.MaxInterval = Duration(DefaultMaxInterval)
}

func (r *Rule) SetDefaults() {
	r.Events = append([]string(nil), EventTypes...)
	r.Include = []string{"object"}
}
