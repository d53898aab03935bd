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

// DefaultConcurrencyMax caps adaptive concurrency: at 64 requests in flight
// a 20 ms receiver takes ~3,000 events/s (one per request), several times a
// busy cluster's change rate, and one bridge never holds more than 64
// connections to a receiver or 64 batches outside its coalescing queue.
const DefaultConcurrencyMax = 64

// Event types a rule can deliver, and what its data can include.
var (
	EventTypes    = []string{"added", "updated", "deleted"}
	IncludeFields = []string{"object", "oldObject", "patch", "metadata", "owners"}
)

func (c *Config) SetDefaults() {}

// applyLateDefaults sets defaults that depend on what the file set.
func (c *Config) applyLateDefaults() {
	if c.Checkpoint.File == "" && c.Checkpoint.NATSKV == nil {
		c.Checkpoint.File = DefaultCheckpointFile
	}
}

func (s *Sharding) SetDefaults() { s.Key = "uid" }

func (k *NATSKVCheckpoint) SetDefaults() { k.Bucket = DefaultKVBucket }

// SetDefaults: a dead-letter file rotates at 100 MiB, keeping 5.
func (d *DeadLetter) SetDefaults() { d.MaxSizeMB, d.MaxBackups = 100, 5 }

func (s *Sink) SetDefaults() {
	s.Queue.Capacity = DefaultQueueCapacity
	s.Retry.InitialInterval = Duration(DefaultInitialInterval)
	s.Retry.MaxInterval = Duration(DefaultMaxInterval)
}

func (c *Concurrency) SetDefaults() { c.Max = DefaultConcurrencyMax }

func (r *Rule) SetDefaults() {
	r.Events = append([]string(nil), EventTypes...)
	r.Include = []string{"object"}
}
