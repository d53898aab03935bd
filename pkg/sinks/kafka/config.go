package kafka

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
)

// DefaultTopic puts each rule's changes on a topic of their own: one
// topic is one view's history, keyed by uid.
const DefaultTopic = "k8s.{cluster}.{rule}"

// Defaults and bounds of the producer.
const (
	// DefaultMaxRecordBytes is franz-go's default batch size, below
	// Kafka's default message.max.bytes (1048588).
	DefaultMaxRecordBytes = 1_000_012
	// DefaultMaxBufferedRecords bounds the records the client holds
	// (buffered or awaiting their acknowledgement), across batches.
	DefaultMaxBufferedRecords = 10_000
	// DefaultMaxBufferedBytes bounds their bytes.
	DefaultMaxBufferedBytes = 64 << 20
	// DefaultTimeout bounds the wait for a batch's acknowledgements.
	DefaultTimeout = 10 * time.Second

	maxMaxRecordBytes     = 64 << 20
	maxMaxBufferedRecords = 1_000_000
	maxMaxBufferedBytes   = 4 << 30
	maxTimeout            = 10 * time.Minute
	maxPartitions         = 10_000
	maxReplicationFactor  = 32
	maxBrokers            = 100
	// MaxTopicLen is Kafka's limit on a topic name.
	MaxTopicLen = 249
)

// Config is the kafka sink's type block: each event is a record on a change topic (CloudEvents Kafka binding, binary mode, keyed by the object's uid) and, with stateTopic, also on a compacted topic per rule that holds the rule's view.
type Config struct {
	// Brokers are the seed brokers, host:port each. Required.
	Brokers []string `yaml:"brokers"`
	// Topic is the change topic template; placeholders {cluster} {rule} {group} {version} {resource} (the core group is core). A topic name is letters, digits, '.', '_' and '-', at most 249 characters. Default k8s.{cluster}.{rule}.
	Topic string `yaml:"topic"`
	// StateTopic, when set, is the template of a compacted topic per rule holding the rule's view: per object (key: uid) its latest event as structured CloudEvent JSON, a tombstone once it left the view. Its only placeholder is {rule}, which it must contain (write the cluster's name literally). Default "": no state topic.
	StateTopic string `yaml:"stateTopic"`
	// CreateTopics creates missing topics on first use (the state topic with cleanup.policy=compact). Default false: topics are managed elsewhere, and a missing one is the destination's error (not_found), retried.
	CreateTopics bool `yaml:"createTopics"`
	// Partitions is, with createTopics, the partition count of created topics. Default 0: the broker's num.partitions.
	Partitions int `yaml:"partitions"`
	// ReplicationFactor is, with createTopics, the replication factor of created topics. Default 0: the broker's default.replication.factor.
	ReplicationFactor int `yaml:"replicationFactor"`
	// MaxRecordBytes is the most bytes of one produce batch: an event whose record does not fit alone is refused, alone and for good (dead-lettered). Keep it at most the topics' max.message.bytes. Default 1000012.
	MaxRecordBytes int `yaml:"maxRecordBytes"`
	// MaxBufferedRecords bounds the records the producer holds at once, buffered or awaiting their acknowledgement, across the sink's concurrent batches; a batch waits for room. Default 10000.
	MaxBufferedRecords int `yaml:"maxBufferedRecords"`
	// MaxBufferedBytes bounds the bytes of those records. Default 67108864 (64 MiB); at least twice maxRecordBytes.
	MaxBufferedBytes int64 `yaml:"maxBufferedBytes"`
	// Timeout bounds the wait for a batch's acknowledgements (acks=all); what is not acknowledged by then is retried. Default 10s.
	Timeout config.Duration `yaml:"timeout"`
	// ClientID is the Kafka client id. Default kubebridge-<sink name>.
	ClientID string `yaml:"clientID"`
	// SASL authenticates the client (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512). Default: none.
	SASL *SASL `yaml:"sasl"`
	// TLS configures the client's TLS. Default: plaintext.
	TLS *config.TLS `yaml:"tls"`
}

// SASL is the kafka sink's SASL authentication.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. Required.
	Mechanism string `yaml:"mechanism"`
	// User is the user name. Required.
	User string `yaml:"user"`
	// PasswordFile is a file holding the password (one line), read again when it changes. Required.
	PasswordFile string `yaml:"passwordFile"`
}

// SetDefaults sets the topic layout and the producer's bounds.
func (c *Config) SetDefaults() {
	c.Topic = DefaultTopic
	c.MaxRecordBytes = DefaultMaxRecordBytes
	c.MaxBufferedRecords = DefaultMaxBufferedRecords
	c.MaxBufferedBytes = DefaultMaxBufferedBytes
	c.Timeout = config.Duration(DefaultTimeout)
}

// Validate checks the brokers, the templates and the bounds.
func (c *Config) Validate() error {
	var errs []error
	switch {
	case len(c.Brokers) == 0:
		errs = append(errs, config.ErrorAt("brokers", "at least one broker (host:port) is required"))
	case len(c.Brokers) > maxBrokers:
		errs = append(errs, config.ErrorAt("brokers", "%d brokers, more than %d (they are only seeds: the client learns the others)", len(c.Brokers), maxBrokers))
	}
	for i, b := range c.Brokers {
		if err := checkBroker(b); err != nil {
			errs = append(errs, config.ErrorAt(fmt.Sprintf("brokers[%d]", i), "%v", err))
		}
	}
	if _, err := parseTemplate(c.Topic, topicPlaceholders); err != nil {
		errs = append(errs, config.ErrorAt("topic", "%v", err))
	}
	if c.StateTopic != "" {
		t, err := parseTemplate(c.StateTopic, statePlaceholders)
		switch {
		case err != nil:
			errs = append(errs, config.ErrorAt("stateTopic", "%v", err))
		case !t.has("rule"):
			errs = append(errs, config.ErrorAt("stateTopic", "%q lacks {rule}: a state topic holds one rule's view, keyed by uid alone", c.StateTopic))
		case c.StateTopic == c.Topic:
			errs = append(errs, config.ErrorAt("stateTopic", "is the change topic %q: the state topic is compacted, the change topic keeps every change", c.Topic))
		}
	}
	if !c.CreateTopics {
		if c.Partitions != 0 {
			errs = append(errs, config.WarningAt("partitions", "has no effect without createTopics: true"))
		}
		if c.ReplicationFactor != 0 {
			errs = append(errs, config.WarningAt("replicationFactor", "has no effect without createTopics: true"))
		}
	}
	if c.Partitions < 0 || c.Partitions > maxPartitions {
		errs = append(errs, config.ErrorAt("partitions", "must be between 0 (the broker's default) and %d, got %d", maxPartitions, c.Partitions))
	}
	if c.ReplicationFactor < 0 || c.ReplicationFactor > maxReplicationFactor {
		errs = append(errs, config.ErrorAt("replicationFactor", "must be between 0 (the broker's default) and %d, got %d", maxReplicationFactor, c.ReplicationFactor))
	}
	if c.MaxRecordBytes < 1024 || c.MaxRecordBytes > maxMaxRecordBytes {
		errs = append(errs, config.ErrorAt("maxRecordBytes", "must be between 1024 and %d, got %d", maxMaxRecordBytes, c.MaxRecordBytes))
	}
	if c.MaxBufferedRecords < 2 || c.MaxBufferedRecords > maxMaxBufferedRecords {
		errs = append(errs, config.ErrorAt("maxBufferedRecords", "must be between 2 and %d, got %d", maxMaxBufferedRecords, c.MaxBufferedRecords))
	}
	switch {
	case c.MaxBufferedBytes > maxMaxBufferedBytes:
		errs = append(errs, config.ErrorAt("maxBufferedBytes", "must be at most %d, got %d", int64(maxMaxBufferedBytes), c.MaxBufferedBytes))
	case c.MaxBufferedBytes < 2*int64(c.MaxRecordBytes):
		// An event is two records with a state topic: both must fit.
		errs = append(errs, config.ErrorAt("maxBufferedBytes", "must be at least twice maxRecordBytes (%d), got %d", 2*c.MaxRecordBytes, c.MaxBufferedBytes))
	}
	if c.Timeout < config.Duration(100*time.Millisecond) || c.Timeout.D() > maxTimeout {
		errs = append(errs, config.ErrorAt("timeout", "must be between 100ms and %s, got %s", maxTimeout, c.Timeout))
	}
	if len(c.ClientID) > 255 || strings.ContainsFunc(c.ClientID, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		errs = append(errs, config.ErrorAt("clientID", "must be at most 255 printable characters"))
	}
	if c.SASL != nil && c.SASL.Mechanism == "PLAIN" && c.TLS == nil {
		errs = append(errs, config.WarningAt("sasl.mechanism", "PLAIN without tls sends the password in clear"))
	}
	return errors.Join(errs...)
}

// Validate checks the mechanism and that a user and a password file are set.
func (s *SASL) Validate() error {
	var errs []error
	switch s.Mechanism {
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
	default:
		errs = append(errs, config.ErrorAt("mechanism", "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got %q", s.Mechanism))
	}
	if s.User == "" {
		errs = append(errs, config.ErrorAt("user", "required"))
	} else if len(s.User) > 255 || strings.ContainsFunc(s.User, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		errs = append(errs, config.ErrorAt("user", "must be at most 255 printable characters"))
	}
	if s.PasswordFile == "" {
		errs = append(errs, config.ErrorAt("passwordFile", "required"))
	}
	return errors.Join(errs...)
}

// checkBroker checks one seed: host:port, nothing else.
func checkBroker(b string) error {
	if strings.Contains(b, "://") {
		return fmt.Errorf("%q: a broker is host:port, without a scheme (TLS is the tls block)", config.RedactURL(b))
	}
	host, port, err := net.SplitHostPort(b)
	if err != nil {
		return fmt.Errorf("%q is not host:port", b)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", b)
	}
	if strings.ContainsFunc(host, func(r rune) bool { return r <= 0x20 || r == 0x7f || r == '/' || r == '@' }) {
		return fmt.Errorf("%q: the host has a character no host name has", b)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port must be 1 to 65535", b)
	}
	return nil
}

// CheckRule says whether rule's topics are legal Kafka topic names
// (config.RuleChecker): the rule's name, group, version and resource go
// into them. The cluster's name is not known here; a topic that it makes
// too long is refused per event at run time.
func (c *Config) CheckRule(rule *config.Rule) error {
	var errs []error
	v := ruleValues(rule.Name, rule.Resource)
	if t, err := parseTemplate(c.Topic, topicPlaceholders); err == nil {
		if err := checkTopic(t.render(v)); err != nil {
			errs = append(errs, fmt.Errorf("topic: %w", err))
		}
	}
	if c.StateTopic != "" {
		if t, err := parseTemplate(c.StateTopic, statePlaceholders); err == nil {
			if err := checkTopic(t.render(v)); err != nil {
				errs = append(errs, fmt.Errorf("stateTopic: %w", err))
			}
		}
		switch {
		case len(rule.Events) > 0 && !(slices.Contains(rule.Events, "added") && slices.Contains(rule.Events, "updated") && slices.Contains(rule.Events, "deleted")):
			errs = append(errs, fmt.Errorf("a state topic holds the rule's view, which takes every change: the rule's events %v leave some out (drop events, or deliver the rule to a sink without stateTopic)", rule.Events))
		case len(rule.Changed) > 0:
			errs = append(errs, errors.New("a state topic holds each object's latest state, which changed would leave stale: drop changed, or deliver the rule to a sink without stateTopic"))
		}
	}
	return errors.Join(errs...)
}

// ruleValues are the placeholders' values of a config rule (the cluster
// left empty): resource is group/version/resource or version/resource.
func ruleValues(rule, resource string) values {
	v := values{rule: rule}
	parts := strings.Split(resource, "/")
	switch len(parts) {
	case 2:
		v.group, v.version, v.resource = "core", parts[0], parts[1]
	case 3:
		v.group, v.version, v.resource = parts[0], parts[1], parts[2]
	}
	return v
}

// checkTopic checks a topic name as Kafka does: 1 to 249 characters of
// [a-zA-Z0-9._-], not "." or "..".
func checkTopic(name string) error {
	switch {
	case name == "":
		return errors.New("the topic name is empty")
	case len(name) > MaxTopicLen:
		return fmt.Errorf("topic %.40q... is %d characters, over Kafka's %d", name, len(name), MaxTopicLen)
	case name == "." || name == "..":
		return fmt.Errorf("topic %q is not a legal name", name)
	}
	for i := 0; i < len(name); i++ {
		if !legal(name[i]) {
			return fmt.Errorf("topic %q has %q; a topic name is letters, digits, '.', '_' and '-'", name, name[i])
		}
	}
	return nil
}

func legal(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}
