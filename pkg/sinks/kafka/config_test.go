package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

func validConfig() *Config {
	c := &Config{}
	c.SetDefaults()
	c.Brokers = []string{"kafka-0.kafka:9092"}
	return c
}

// Each config error names its key and the value found.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // "" for valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"no brokers", func(c *Config) { c.Brokers = nil }, "brokers: at least one broker (host:port) is required"},
		{"scheme", func(c *Config) { c.Brokers = []string{"kafka://k:9092"} }, `brokers[0]: "kafka://k:9092": a broker is host:port, without a scheme (TLS is the tls block)`},
		{"no port", func(c *Config) { c.Brokers = []string{"k"} }, `brokers[0]: "k" is not host:port`},
		{"bad port", func(c *Config) { c.Brokers = []string{"k:0"} }, `brokers[0]: "k:0": port must be 1 to 65535`},
		{"topic chars", func(c *Config) { c.Topic = "k8s/{rule}" }, `topic: "k8s/{rule}" has '/'; a topic name is letters, digits, '.', '_' and '-' (and {placeholders})`},
		{"topic placeholder", func(c *Config) { c.Topic = "k8s.{name}" }, `topic: "k8s.{name}": unknown placeholder {name} (have: {cluster} {group} {resource} {rule} {version})`},
		{"state without rule", func(c *Config) { c.StateTopic = "state" }, `stateTopic: "state" lacks {rule}: a state topic holds one rule's view, keyed by uid alone`},
		{"state with cluster", func(c *Config) { c.StateTopic = "s.{cluster}.{rule}" }, `stateTopic: "s.{cluster}.{rule}": unknown placeholder {cluster} (have: {rule})`},
		{"state is topic", func(c *Config) { c.Topic = "x.{rule}"; c.StateTopic = "x.{rule}" }, `stateTopic: is the change topic "x.{rule}": the state topic is compacted, the change topic keeps every change`},
		{"record bytes", func(c *Config) { c.MaxRecordBytes = 10 }, "maxRecordBytes: must be between 1024 and 67108864, got 10"},
		{"buffered records", func(c *Config) { c.MaxBufferedRecords = 0 }, "maxBufferedRecords: must be between 2 and 1000000, got 0"},
		{"buffered bytes", func(c *Config) { c.MaxBufferedBytes = 1 << 20 }, "maxBufferedBytes: must be at least twice maxRecordBytes (2000024), got 1048576"},
		{"timeout", func(c *Config) { c.Timeout = 0 }, "timeout: must be between 100ms and 10m0s, got 0s"},
		{"partitions", func(c *Config) { c.CreateTopics = true; c.Partitions = -2 }, "partitions: must be between 0 (the broker's default) and 10000, got -2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.edit(c)
			err := c.Validate()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("Validate:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestValidateSASL(t *testing.T) {
	s := &SASL{Mechanism: "GSSAPI"}
	want := `mechanism: must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got "GSSAPI"` + "\nuser: required\npasswordFile: required"
	if err := s.Validate(); err == nil || err.Error() != want {
		t.Errorf("Validate: %v, want %q", err, want)
	}
	c := validConfig()
	c.SASL = &SASL{Mechanism: "PLAIN", User: "u", PasswordFile: "/etc/kubebridge/pw"}
	if err := c.Validate(); err == nil || err.Error() != "sasl.mechanism: PLAIN without tls sends the password in clear" {
		t.Errorf("PLAIN without TLS: %v", err)
	}
}

// A rule whose name makes a topic too long is refused at the rule.
func TestCheckRule(t *testing.T) {
	c := validConfig()
	c.StateTopic = "state." + strings.Repeat("s", 200) + ".{rule}"
	ok := &config.Rule{Name: "cms", Resource: "v1/configmaps"}
	if err := c.CheckRule(ok); err != nil {
		t.Errorf("CheckRule(cms): %v", err)
	}
	long := &config.Rule{Name: strings.Repeat("r", 63), Resource: "example.kubebridge.io/v1/widgets"}
	err := c.CheckRule(long)
	if err == nil || !strings.HasPrefix(err.Error(), "stateTopic: topic \"state.ssssssssssssssssssssssssssssssssss\"... is 270 characters, over Kafka's 249") {
		t.Errorf("CheckRule(long): %v", err)
	}
	if err := c.CheckRule(&config.Rule{Name: "cms", Resource: "v1/configmaps", Events: []string{"added", "deleted"}}); err == nil || !strings.Contains(err.Error(), "a state topic holds the rule's view, which takes every change: the rule's events [added deleted] leave some out") {
		t.Errorf("CheckRule(events): %v", err)
	}
	if err := c.CheckRule(&config.Rule{Name: "cms", Resource: "v1/configmaps", Changed: []string{"spec"}}); err == nil || !strings.Contains(err.Error(), "changed would leave stale") {
		t.Errorf("CheckRule(changed): %v", err)
	}
	c.Topic = "{group}.{version}.{resource}.{rule}"
	c.StateTopic = ""
	if err := c.CheckRule(&config.Rule{Name: "w", Resource: "example.kubebridge.io/v1/widgets"}); err != nil {
		t.Errorf("CheckRule(widgets): %v", err)
	}
}

// The loader's walk reaches the sink's block: a bad one is refused with
// its full path.
func TestLoadedConfigErrorsNameTheirPath(t *testing.T) {
	r, err := sinks.NewRegistry(Factory)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = config.Parse("kb.yaml", []byte(`apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: c
sinks:
  - name: k
    kafka: {brokers: ["k:9092"], topic: "a b", sasl: {mechanism: PLAIN}}
rules:
  - name: cms
    resource: v1/configmaps
    sinks: [k]
`), r)
	for _, want := range []string{"sinks[0].kafka.topic", "sinks[0].kafka.sasl.user"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("loading: %v; want an error at %s", err, want)
		}
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w (uncompressed_bytes=5)", kerr.MessageTooLarge), "permanent"},
		{fmt.Errorf("%w (uncompressed_bytes=5, compressed_bytes=4)", kerr.MessageTooLarge), "destination:config"},
		{kerr.RecordListTooLarge, "destination:config"},
		{kerr.SaslAuthenticationFailed, "destination:unauthorized"},
		{kerr.TopicAuthorizationFailed, "destination:forbidden"},
		{kerr.UnknownTopicOrPartition, "destination:not_found"},
		{kerr.NotLeaderForPartition, "unavailable"},
		{kerr.RequestTimedOut, "unavailable"},
		{kgo.ErrRecordTimeout, "unavailable"},
		{kgo.ErrClientClosed, "unavailable"},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, "unavailable"},
		{context.Canceled, "other"},
	} {
		err := classify(tc.err)
		got := "other"
		if r, ok := sinks.DestinationReason(err); ok {
			got = "destination:" + r
		} else if sinks.IsPermanent(err) {
			got = "permanent"
		} else if sinks.IsUnavailable(err) {
			got = "unavailable"
		}
		if got != tc.want {
			t.Errorf("classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

// The example config decodes every field of the block (config/kafka.yaml
// sets them all but the bounds).
func TestExampleConfigLoads(t *testing.T) {
	r, err := sinks.NewRegistry(Factory)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config.Load("../../../config/kafka.yaml", r)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Sinks[0].Spec.(*Config)
	if c.Partitions != 12 || c.ReplicationFactor != 3 || !c.CreateTopics || c.SASL == nil || c.SASL.Mechanism != "SCRAM-SHA-512" ||
		c.TLS == nil || c.StateTopic != "k8s.prod-eu-1.state.{rule}" || c.MaxRecordBytes != DefaultMaxRecordBytes || len(c.Brokers) != 3 {
		t.Errorf("decoded %+v", c)
	}
}
