package config_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/components"
	. "github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/sinks"
	"github.com/kubebridge/kubebridge/pkg/sinks/file"
	"github.com/kubebridge/kubebridge/pkg/sinks/nats"
	"github.com/kubebridge/kubebridge/pkg/sinks/webhook"
)

// types are the sink types of this build, as bridge run and validate load them.
var types = components.SinkRegistry()

// base is a valid config; each invalid case below changes one spot of it.
// Line numbers in the expectations refer to this text after the change.
const base = `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: prod-eu-1
sinks:
  - name: bus
    nats:
      url: nats://127.0.0.1:4222
      jetstream: true
  - name: hook
    webhook:
      url: https://hooks.example.com/k8s
  - name: archive
    file: {path: /tmp/events.jsonl}
rules:
  - name: deployments
    resource: apps/v1/deployments
    namespaces: [prod]
    sinks: [bus, archive]
  - name: configmaps
    resource: v1/configmaps
    where: "object.metadata.name != 'x'"
    sinks: [hook]
`

func TestBaseIsValidWithDefaults(t *testing.T) {
	cfg, warnings, err := Parse("config.yaml", []byte(base), types)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings: %v", warnings)
	}
	bus := cfg.Sinks[0]
	if bus.Queue.Capacity != DefaultQueueCapacity || bus.Retry.InitialInterval.D() != 200*time.Millisecond ||
		bus.Retry.MaxInterval.D() != 30*time.Second || bus.Retry.MaxElapsed != 0 || bus.ReplayEvery != 0 {
		t.Errorf("sink defaults: queue %+v retry %+v replayEvery %s", bus.Queue, bus.Retry, bus.ReplayEvery)
	}
	if n, adaptive := bus.InFlight(); n != DefaultConcurrencyMax || !adaptive || bus.Workers != 0 || bus.Concurrency != nil {
		t.Errorf("concurrency default: %d in flight, adaptive %v (workers %d, concurrency %+v); want adaptive up to %d", n, adaptive, bus.Workers, bus.Concurrency, DefaultConcurrencyMax)
	}
	if bus.Spec.(*nats.Config).Subject != nats.DefaultSubject {
		t.Errorf("subject default = %q", bus.Spec.(*nats.Config).Subject)
	}
	if w := cfg.Sinks[1].Spec.(*webhook.Config); w.Mode != "binary" || w.Timeout.D() != 5*time.Second || w.Batch != nil {
		t.Errorf("webhook defaults: %+v", w)
	}
	if f := cfg.Sinks[2].Spec.(*file.Config); f.MaxSizeMB != 100 || f.MaxBackups != 5 {
		t.Errorf("file defaults: %+v", f)
	}
	r := cfg.Rules[0]
	if !reflect.DeepEqual(r.Events, []string{"added", "updated", "deleted"}) || !reflect.DeepEqual(r.Include, []string{"object"}) {
		t.Errorf("rule defaults: events %v include %v", r.Events, r.Include)
	}
	if cfg.Checkpoint.File != DefaultCheckpointFile {
		t.Errorf("checkpoint default = %q", cfg.Checkpoint.File)
	}
	if got := cfg.LineOf("rules[1].where"); got != 21 {
		t.Errorf("LineOf(rules[1].where) = %d, want 21", got)
	}
}

// What a file sets wins over the defaults, also for nested blocks set only in part.
func TestExplicitValuesOverrideDefaults(t *testing.T) {
	cfg := mustParse(t, mutate(t, base, "      jetstream: true\n", "      jetstream: true\n      subject: \"events.{name}\"\n    queue: {capacity: 7}\n    retry: {maxInterval: 1m}\n    replayEvery: 1h\n"))
	bus := cfg.Sinks[0]
	if bus.Queue.Capacity != 7 || bus.Retry.MaxInterval.D() != time.Minute || bus.Retry.InitialInterval.D() != DefaultInitialInterval || bus.ReplayEvery.D() != time.Hour {
		t.Errorf("got queue %+v retry %+v replay %s", bus.Queue, bus.Retry, bus.ReplayEvery)
	}
	if got := bus.Spec.(*nats.Config).Subject; got != "events.{name}" {
		t.Errorf("subject = %q", got)
	}
	cfg = mustParse(t, mutate(t, base, "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      batch: {maxEvents: 10}\n"))
	if b := cfg.Sinks[1].Spec.(*webhook.Config).Batch; b == nil || b.MaxEvents != 10 || b.MaxWait.D() != webhook.DefaultBatchMaxWait {
		t.Errorf("batch = %+v", b)
	}
	cfg = mustParse(t, mutate(t, base, "      jetstream: true\n", "      jetstream: true\n    concurrency: {max: 200}\n"))
	if n, adaptive := cfg.Sinks[0].InFlight(); n != 200 || !adaptive {
		t.Errorf("concurrency {max: 200}: %d, adaptive %v", n, adaptive)
	}
	cfg = mustParse(t, mutate(t, base, "      jetstream: true\n", "      jetstream: true\n    concurrency: {}\n"))
	if n, adaptive := cfg.Sinks[0].InFlight(); n != DefaultConcurrencyMax || !adaptive {
		t.Errorf("concurrency {}: %d, adaptive %v", n, adaptive)
	}
	cfg = mustParse(t, mutate(t, base, "      jetstream: true\n", "      jetstream: true\n    workers: 3\n"))
	if n, adaptive := cfg.Sinks[0].InFlight(); n != 3 || adaptive {
		t.Errorf("workers 3: %d, adaptive %v; want exactly 3", n, adaptive)
	}
	cfg = mustParse(t, mutate(t, base, "      jetstream: true\n", "      jetstream: true\n    rateLimit: {eventsPerSecond: 0.5}\n"))
	if r := cfg.Sinks[0].RateLimit; r == nil || r.EventsPerSecond != 0.5 || r.BurstOrDefault() != 1 {
		t.Errorf("rateLimit = %+v", r)
	}
	cfg = mustParse(t, mutate(t, base, "      jetstream: true\n", "      jetstream: true\n    updateWindow: 30s\n"))
	if w := cfg.Sinks[0].UpdateWindow; w.Every.D() != 30*time.Second || w.Key != "" {
		t.Errorf("updateWindow: 30s = %+v, want a window of 30s per object", w)
	}
	cfg = mustParse(t, mutate(t, base, "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      preset: slack\n    updateWindow: {every: 10m, key: \"object.involvedObject.uid + '/' + object.reason\"}\n"))
	if w := cfg.Sinks[1].UpdateWindow; w.Every.D() != 10*time.Minute || w.Key == "" || w.KeysOrDefault() != DefaultWindowMaxKeys {
		t.Errorf("updateWindow with a key = %+v", w)
	}
	cfg = mustParse(t, mutate(t, base, "cluster: prod-eu-1\n", "cluster: prod-eu-1\ncheckpoint: {natsKV: {sink: bus}}\n"))
	if cfg.Checkpoint.File != "" || cfg.Checkpoint.NATSKV.Bucket != DefaultKVBucket {
		t.Errorf("checkpoint = %+v / %+v", cfg.Checkpoint, cfg.Checkpoint.NATSKV)
	}
}

func TestInvalidConfigs(t *testing.T) {
	cases := []struct {
		name     string
		old, new string
		want     []string // each problem, formatted; a trailing "…" matches a prefix
	}{
		{"wrong apiVersion", "apiVersion: kubebridge.io/v1alpha1", "apiVersion: kubebridge.io/v1",
			[]string{`config.yaml:1: apiVersion: must be "kubebridge.io/v1alpha1", got "kubebridge.io/v1"`}},
		{"wrong kind", "kind: BridgeConfig", "kind: Bridge",
			[]string{`config.yaml:2: kind: must be "BridgeConfig", got "Bridge"`}},
		{"missing cluster", "cluster: prod-eu-1\n", "",
			[]string{`config.yaml:1: cluster: required: the name stamped on every event (e.g. prod-eu-1)`}},
		{"invalid cluster", "cluster: prod-eu-1", "cluster: Prod_EU",
			[]string{`config.yaml:3: cluster: invalid name "Prod_EU": a lowercase RFC 1123 label…`}},
		{"unknown top-level field", "cluster: prod-eu-1\n", "cluster: prod-eu-1\nclustr: x\n",
			[]string{`config.yaml:4: clustr: unknown field (did you mean "cluster"?)`}},
		{"unknown field lists known ones", "cluster: prod-eu-1\n", "cluster: prod-eu-1\nzzzzzz: x\n",
			[]string{`config.yaml:4: zzzzzz: unknown field (known: apiVersion, checkpoint, cluster, kind, redaction, rules, sharding, sinks)`}},
		{"misspelt sink field", "      url: nats://127.0.0.1:4222", "      urls: nats://127.0.0.1:4222",
			[]string{`config.yaml:6: sinks[0].nats.url: required unless embedded: true`, `config.yaml:7: sinks[0].nats.urls: unknown field (did you mean "url"?)`}},
		{"duplicate key", "      jetstream: true\n", "      jetstream: true\n      jetstream: false\n",
			[]string{`config.yaml:9: sinks[0].nats.jetstream: duplicate key (first at line 8)`}},
		{"bool type", "jetstream: true", "jetstream: yes please",
			[]string{`config.yaml:8: sinks[0].nats.jetstream: expected true or false, got "yes please"`}},
		{"list where a mapping goes", "    nats:\n      url: nats://127.0.0.1:4222\n      jetstream: true\n", "    nats: [a, b]\n",
			[]string{`config.yaml:6: sinks[0].nats: expected a mapping, got a list`}},
		{"queue capacity zero", "      jetstream: true\n", "      jetstream: true\n    queue: {capacity: 0}\n",
			[]string{`config.yaml:9: sinks[0].queue.capacity: must be between 1 and 10000000, got 0`}},
		{"queue capacity not a number", "      jetstream: true\n", "      jetstream: true\n    queue: {capacity: lots}\n",
			[]string{`config.yaml:9: sinks[0].queue.capacity: expected an integer, got "lots"`}},
		{"retry max below initial", "      jetstream: true\n", "      jetstream: true\n    retry: {initialInterval: 5s, maxInterval: 1s}\n",
			[]string{`config.yaml:9: sinks[0].retry.maxInterval: must be at least initialInterval (5s), got 1s`}},
		{"invalid duration", "      jetstream: true\n", "      jetstream: true\n    retry: {initialInterval: 10x}\n",
			[]string{`config.yaml:9: sinks[0].retry.initialInterval: invalid duration "10x" (want e.g. 200ms, 5s, 1h)`}},
		{"negative maxElapsed", "      jetstream: true\n", "      jetstream: true\n    retry: {maxElapsed: -1s}\n",
			[]string{`config.yaml:9: sinks[0].retry.maxElapsed: must be 0 (retry until acknowledged) or positive, got -1s`}},
		{"replayEvery too short", "      jetstream: true\n", "      jetstream: true\n    replayEvery: 10ms\n",
			[]string{`config.yaml:9: sinks[0].replayEvery: must be 0 (never) or at least 1s, got 10ms`}},
		{"updateWindow key that does not compile", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      preset: slack\n    updateWindow: {every: 1m, key: \"objekt.reason\"}\n",
			[]string{`config.yaml:13: sinks[1].updateWindow.key: undeclared reference to 'objekt' (column 1)`}},
		{"updateWindow key not a string", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      preset: slack\n    updateWindow: {every: 1m, key: \"object.metadata.generation\"}\n",
			[]string{`config.yaml:13: sinks[1].updateWindow.key: must be a string expression, got int`}},
		{"updateWindow key reads owners a rule of the sink lacks", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      preset: slack\n    updateWindow: {every: 1m, key: \"owners[0].name\"}\n",
			[]string{`config.yaml:13: sinks[1].updateWindow.key: reads owners, which rule "configmaps" resolves only with include: [owners] (add owners to its include)`}},
		{"updateWindow key without every", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      preset: slack\n    updateWindow: {key: \"object.metadata.name\"}\n",
			[]string{`config.yaml:13: sinks[1].updateWindow.key: needs every: the window each key's messages are held to one in`}},
		{"updateWindow key on a sink consumers apply by uid", "      jetstream: true\n", "      jetstream: true\n    updateWindow: {every: 1m, key: \"object.metadata.name\"}\n",
			[]string{`config.yaml:9: sinks[0].updateWindow.key: a window per key coalesces different objects into one message: only for a sink that sends messages for people (a webhook with request or preset, not an alert's); this nats sink's consumer…`}},
		{"updateWindow key on an alert preset", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      preset: pagerduty\n      credentialFiles: {routingKey: /etc/pd/key}\n    updateWindow: {every: 1m, key: \"object.metadata.name\"}\n",
			[]string{`config.yaml:14: sinks[1].updateWindow.key: a window per key coalesces different objects into one message…`}},
		{"updateWindow not a duration", "      jetstream: true\n", "      jetstream: true\n    updateWindow: soon\n",
			[]string{`config.yaml:9: sinks[0].updateWindow: invalid duration "soon" (want e.g. 200ms, 5s, 1h)`}},
		{"sink without a kind", "    file: {path: /tmp/events.jsonl}", "    queue: {capacity: 5}",
			[]string{`config.yaml:12: sinks[2]: needs a type block, one of: exec, file, kafka, nats, webhook`}},
		{"unknown sink type", "    file: {path: /tmp/events.jsonl}", "    fiel: {path: /tmp/events.jsonl}",
			[]string{`config.yaml:13: sinks[2].fiel: unknown field or sink type (did you mean "file"?)`, `config.yaml:12: sinks[2]: needs a type block, one of: exec, file, kafka, nats, webhook`}},
		{"sink with two kinds", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n    file: {path: /tmp/x}\n",
			[]string{`config.yaml:12: sinks[1]: sets webhook and file; a sink has exactly one type (exec, file, kafka, nats, webhook)`}},
		{"duplicate sink name", "  - name: archive", "  - name: bus",
			[]string{`config.yaml:12: sinks[2].name: duplicate sink name "bus" (first at sinks[0])`, `config.yaml:18: rules[0].sinks[1]: unknown sink "archive" (have: bus, hook)`}},
		{"invalid sink name", "  - name: hook", "  - name: Hook_1",
			[]string{`config.yaml:9: sinks[1].name: invalid name "Hook_1": a lowercase RFC 1123 label…`, `config.yaml:22: rules[1].sinks[0]: unknown sink "hook" (have: bus, Hook_1, archive)`,
				`config.yaml:9: warning: sinks[1]: sink "Hook_1" is not used by any rule`}},
		{"nats url scheme", "url: nats://127.0.0.1:4222", "url: http://127.0.0.1:4222",
			[]string{`config.yaml:7: sinks[0].nats.url: URL "http://127.0.0.1:4222": scheme must be nats, tls, ws or wss`}},
		{"nats url list with a bad one", "url: nats://127.0.0.1:4222", "url: nats://a:4222,nats://",
			[]string{`config.yaml:7: sinks[0].nats.url: URL "nats://" has no host`}},
		{"nats subject placeholder", "      jetstream: true\n", "      jetstream: true\n      subject: \"k8s.{clustr}.{name}\"\n",
			[]string{`config.yaml:9: sinks[0].nats.subject: unknown placeholder {clustr} (have: {cluster} {group} {version} {resource} {kind} {namespace} {name} {type} {rule})`}},
		{"nats subject wildcard", "      jetstream: true\n", "      jetstream: true\n      subject: \"k8s.>\"\n",
			[]string{`config.yaml:9: sinks[0].nats.subject: token ">" has '>'; subjects take no wildcards, spaces or stray braces`}},
		{"nats subject empty token", "      jetstream: true\n", "      jetstream: true\n      subject: \"k8s..{name}\"\n",
			[]string{`config.yaml:9: sinks[0].nats.subject: token 2 is empty`}},
		{"nats two auth methods", "      jetstream: true\n", "      jetstream: true\n      tokenFile: /t\n      credentialsFile: /c\n",
			[]string{`config.yaml:6: sinks[0].nats: sets credentialsFile and tokenFile; choose one auth method`}},
		{"embedded nats beyond loopback without auth", "      url: nats://127.0.0.1:4222\n      jetstream: true\n", "      url: nats://0.0.0.0:4222\n      embedded: true\n",
			[]string{`config.yaml:7: sinks[0].nats.url: the embedded server would listen on 0.0.0.0, beyond this machine: set tokenFile or user/passwordFile, which it then requires of every client`}},
		{"redaction key", "cluster: prod-eu-1\n", "cluster: prod-eu-1\nredaction: {secretAnnotations: [\"*\", \"not a key\"]}\n",
			[]string{`config.yaml:4: redaction.secretAnnotations[1]: "not a key" is not an annotation key (or "*" for all): …`}},
		{"nats user without password", "      jetstream: true\n", "      jetstream: true\n      user: kb\n",
			[]string{`config.yaml:6: sinks[0].nats.passwordFile: required with user`}},
		{"webhook url without scheme", "url: https://hooks.example.com/k8s", "url: hooks.example.com/k8s",
			[]string{`config.yaml:11: sinks[1].webhook.url: URL "hooks.example.com/k8s": scheme must be http or https`}},
		{"webhook mode", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      mode: json\n",
			[]string{`config.yaml:12: sinks[1].webhook.mode: must be binary or structured, got "json"`}},
		{"webhook reserved header", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      headers: {ce-id: x, X-Team: a}\n",
			[]string{`config.yaml:12: sinks[1].webhook.headers.ce-id: is set by kubebridge and cannot be overridden`}},
		{"webhook header name", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      headers: {\"bad header\": x}\n",
			[]string{`config.yaml:12: sinks[1].webhook.headers["bad header"]: invalid header name`}},
		{"webhook batch size", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      batch: {maxEvents: 0}\n",
			[]string{`config.yaml:12: sinks[1].webhook.batch.maxEvents: must be between 1 and 10000, got 0`}},
		{"webhook request template", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      request:\n        body: \"{'name': objekt.metadata.name}\"\n",
			[]string{`config.yaml:13: sinks[1].webhook.request.body: undeclared reference to 'objekt' (column 10)`}},
		{"webhook timeout", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      timeout: 0s\n",
			[]string{`config.yaml:12: sinks[1].webhook.timeout: must be positive, got 0s`}},
		{"tls cert without key", "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      tls: {certFile: /c}\n",
			[]string{`config.yaml:12: sinks[1].webhook.tls: certFile and keyFile go together`}},
		{"file path empty", "file: {path: /tmp/events.jsonl}", "file: {path: \"\"}",
			[]string{`config.yaml:13: sinks[2].file.path: required (a file path, or "-" for stdout)`}},
		{"file size zero", "file: {path: /tmp/events.jsonl}", "file: {path: /x, maxSizeMB: 0}",
			[]string{`config.yaml:13: sinks[2].file.maxSizeMB: must be between 1 and 1048576 (1 TiB), got 0`}},
		{"rate limit not a number", "file: {path: /tmp/events.jsonl}", "file: {path: /tmp/events.jsonl}\n    rateLimit: {eventsPerSecond: fast}",
			[]string{`config.yaml:14: sinks[2].rateLimit.eventsPerSecond: expected a number, got "fast"`}},
		{"rate limit zero", "file: {path: /tmp/events.jsonl}", "file: {path: /tmp/events.jsonl}\n    rateLimit: {eventsPerSecond: 0}",
			[]string{`config.yaml:14: sinks[2].rateLimit.eventsPerSecond: must be positive and at most 1000000, got 0`}},
		{"dead-letter file size", "file: {path: /tmp/events.jsonl}", "file: {path: /tmp/events.jsonl}\n    deadLetter: {file: /tmp/dl.jsonl, maxSizeMB: -1, maxBackups: -2}",
			[]string{`config.yaml:14: sinks[2].deadLetter.maxSizeMB: must be at least 1, got -1`, `config.yaml:14: sinks[2].deadLetter.maxBackups: must not be negative, got -2`}},
		{"unknown sink in rule", "    sinks: [bus, archive]", "    sinks: [bus, bsu]",
			[]string{`config.yaml:18: rules[0].sinks[1]: unknown sink "bsu" (have: bus, hook, archive)`, `config.yaml:12: warning: sinks[2]: sink "archive" is not used by any rule`}},
		{"sink listed twice", "    sinks: [bus, archive]", "    sinks: [bus, archive, bus]",
			[]string{`config.yaml:18: rules[0].sinks[2]: sink "bus" listed twice (first at sinks[0])`}},
		{"rule without sinks", "    sinks: [hook]\n", "",
			[]string{`config.yaml:19: rules[1].sinks: at least one sink is required`, `config.yaml:9: warning: sinks[1]: sink "hook" is not used by any rule`}},
		{"rule without resource", "    resource: v1/configmaps\n", "",
			[]string{`config.yaml:19: rules[1].resource: required (group/version/resource, e.g. apps/v1/deployments, or v1/configmaps for the core group)`}},
		{"resource without version", "resource: apps/v1/deployments", "resource: apps/deployments",
			[]string{`config.yaml:16: rules[0].resource: "apps/deployments" is not group/version/resource (e.g. apps/v1/deployments) or core version/resource (e.g. v1/configmaps)`}},
		{"resource in capitals", "resource: apps/v1/deployments", "resource: apps/v1/Deployments",
			[]string{`config.yaml:16: rules[0].resource: resource "Deployments" in "apps/v1/Deployments" must be the plural lowercase name (e.g. deployments): …`}},
		{"duplicate rule name", "  - name: configmaps", "  - name: deployments",
			[]string{`config.yaml:19: rules[1].name: duplicate rule name "deployments" (first at rules[0])`}},
		{"namespaces and namespaceSelector", "    namespaces: [prod]\n", "    namespaces: [prod]\n    namespaceSelector: env=prod\n",
			[]string{`config.yaml:18: rules[0].namespaceSelector: set either namespaces or namespaceSelector, not both`}},
		{"invalid namespace", "namespaces: [prod]", "namespaces: [prod, Prod]",
			[]string{`config.yaml:17: rules[0].namespaces[1]: invalid name "Prod": a lowercase RFC 1123 label…`}},
		{"label selector", "    namespaces: [prod]\n", "    namespaces: [prod]\n    labelSelector: \"team in (a\"\n",
			[]string{`config.yaml:18: rules[0].labelSelector: unable to parse requirement: found '', expected: ',' or ')'`}},
		{"field selector", "    namespaces: [prod]\n", "    namespaces: [prod]\n    fieldSelector: \"metadata.name\"\n",
			[]string{`config.yaml:18: rules[0].fieldSelector: invalid selector: 'metadata.name'; can't understand 'metadata.name'`}},
		{"unknown event", "    namespaces: [prod]\n", "    namespaces: [prod]\n    events: [added, modified]\n",
			[]string{`config.yaml:18: rules[0].events[1]: unknown value "modified" (want one of added, updated, deleted)`}},
		{"no events", "    namespaces: [prod]\n", "    namespaces: [prod]\n    events: []\n",
			[]string{`config.yaml:18: rules[0].events: must list at least one of added, updated, deleted`}},
		{"unknown include", "    namespaces: [prod]\n", "    namespaces: [prod]\n    include: [object, diff]\n",
			[]string{`config.yaml:18: rules[0].include[1]: unknown value "diff" (want one of object, oldObject, patch, metadata, owners)`}},
		{"metadata with object", "    namespaces: [prod]\n", "    namespaces: [prod]\n    include: [metadata, object]\n",
			[]string{`config.yaml:18: rules[0].include: metadata stands alone (or with owners): it is the object without spec, status or data`}},
		{"where reads owners without include", "    namespaces: [prod]\n", "    namespaces: [prod]\n    where: \"owners.exists(o, o.kind == 'Deployment')\"\n",
			[]string{`config.yaml:18: rules[0].where: reads owners, which the rule resolves only with include: [owners] (add owners to its include)`}},
		{"where reads involved of a Deployment", "    namespaces: [prod]\n", "    namespaces: [prod]\n    include: [object, owners]\n    where: \"involved.owners.exists(o, o.labels.team == 'a')\"\n",
			[]string{`config.yaml:19: rules[0].where: reads involved, which only Kubernetes Events have (v1/events, events.k8s.io/v1/events), not apps/v1/deployments of the rule`}},
		{"where misspells an owner field", "    namespaces: [prod]\n", "    namespaces: [prod]\n    include: [owners]\n    where: \"owners.exists(o, o.knd == 'Deployment')\"\n",
			[]string{`config.yaml:19: rules[0].where: undefined field 'knd' (column 19)`}},
		{"ownerLabels", "    namespaces: [prod]\n", "    namespaces: [prod]\n    ownerLabels: [team, \"not a key\"]\n",
			[]string{`config.yaml:18: rules[0].ownerLabels: has no effect without include: [owners]`, `config.yaml:18: rules[0].ownerLabels[1]: invalid label key "not a key": …`}},
		{"Secrets as owners", "    namespaces: [prod]\n", "    namespaces: [prod]\n    include: [owners]\n    ownerResources: [v1/secrets]\n",
			[]string{`config.yaml:19: rules[0].ownerResources[0]: Secrets own nothing, and listing them reads their values: not an owner resource`}},
		{"ownerResources without owners", "    namespaces: [prod]\n", "    namespaces: [prod]\n    ownerResources: [argoproj.io/v1alpha1/rollouts, argoproj.io/rollouts]\n",
			[]string{`config.yaml:18: rules[0].ownerResources: has no effect without include: [owners]`, `config.yaml:18: rules[0].ownerResources[1]: "argoproj.io/rollouts" is not group/version/resource (e.g. apps/v1/deployments) or core version/resource (e.g. v1/configmaps)`}},
		{"unknown index key", "    namespaces: [prod]\n", "    namespaces: [prod]\n    index: {tier: [a]}\n",
			[]string{`config.yaml:18: rules[0].index.tier: index key "tier": want namespace, label:<key>, annotation:<key> or owner:<Kind>`}},
		{"index owner kind", "    namespaces: [prod]\n", "    namespaces: [prod]\n    index: {\"owner:replicaset\": [a]}\n",
			[]string{`config.yaml:18: rules[0].index["owner:replicaset"]: index key "owner:replicaset": owner takes a Kind such as owner:ReplicaSet`}},
		{"index without values", "    namespaces: [prod]\n", "    namespaces: [prod]\n    index: {\"label:tier\": []}\n",
			[]string{`config.yaml:18: rules[0].index["label:tier"]: needs at least one value`}},
		{"index label value", "    namespaces: [prod]\n", "    namespaces: [prod]\n    index: {\"label:tier\": [\"front end\"]}\n",
			[]string{`config.yaml:18: rules[0].index["label:tier"][0]: invalid label value "front end": …`}},
		{"where undeclared reference", `where: "object.metadata.name != 'x'"`, `where: "objekt.metadata.name != 'x'"`,
			[]string{`config.yaml:21: rules[1].where: undeclared reference to 'objekt' (column 1)`}},
		{"where syntax", `where: "object.metadata.name != 'x'"`, `where: "object.metadata.name != "`,
			[]string{`config.yaml:21: rules[1].where: Syntax error: mismatched input '<EOF>' expecting …`}},
		{"where not a bool", `where: "object.metadata.name != 'x'"`, `where: "'a' + 'b'"`,
			[]string{`config.yaml:21: rules[1].where: must be a boolean expression, got string`}},
		{"route CEL error", "    sinks: [bus, archive]\n", "    sinks: [bus, archive]\n    route: {sink: \"'x-' + namespaceLabel.team\", default: bus}\n",
			[]string{`config.yaml:19: rules[0].route.sink: undeclared reference to 'namespaceLabel' (column 8)`}},
		{"route not a string", "    sinks: [bus, archive]\n", "    sinks: [bus, archive]\n    route: {sink: \"size(object.metadata.labels)\", default: bus}\n",
			[]string{`config.yaml:19: rules[0].route.sink: must be a string expression (a sink's name), got int`}},
		{"route reads oldObject", "    sinks: [bus, archive]\n", "    sinks: [bus, archive]\n    route: {sink: \"oldObject.metadata.name\", default: bus}\n",
			[]string{`config.yaml:19: rules[0].route.sink: reads oldObject: a route is part of the rule's view, decided by the object's current state alone`}},
		{"route default not a sink of the rule", "    sinks: [bus, archive]\n", "    sinks: [bus, archive]\n    route:\n      sink: \"'bus'\"\n      default: hook\n",
			[]string{`config.yaml:21: rules[0].route.default: "hook" is not one of the rule's sinks (bus, archive): a route chooses among them only`}},
		{"route without sink or default", "    sinks: [bus, archive]\n", "    sinks: [bus, archive]\n    route: {}\n",
			[]string{`config.yaml:19: rules[0].route.sink: required: …`, `config.yaml:19: rules[0].route.default: required: the sink of objects whose route names none of the rule's sinks (one of bus, archive)`}},
		{"changed path", "    namespaces: [prod]\n", "    namespaces: [prod]\n    changed: [spec, \"metadata..labels\"]\n",
			[]string{`config.yaml:18: rules[0].changed[1]: path "metadata..labels": empty key`}},
		{"changed path with a dotted key unquoted", "    namespaces: [prod]\n", "    namespaces: [prod]\n    changed: [\"metadata.annotations.app/x\"]\n",
			[]string{`config.yaml:18: rules[0].changed[0]: path "metadata.annotations.app/x": key "app/x" has '/'; write it as ["app/x"]`}},
		{"checkpoint file and natsKV", "cluster: prod-eu-1\n", "cluster: prod-eu-1\ncheckpoint: {file: /x, natsKV: {sink: bus}}\n",
			[]string{`config.yaml:4: checkpoint: set either file or natsKV, not both`}},
		{"sharding without a KV checkpoint", "cluster: prod-eu-1\n", "cluster: prod-eu-1\nsharding: {shards: 4}\n",
			[]string{`config.yaml:4: sharding: needs checkpoint.natsKV: a shard's acknowledged views must be readable by whichever replica owns the shard next, and a file is one replica's`}},
		{"sharding out of bounds", "cluster: prod-eu-1\n", "cluster: prod-eu-1\ncheckpoint: {natsKV: {sink: bus}}\nsharding: {shards: 257, key: name}\n",
			[]string{`config.yaml:5: sharding.shards: must be between 1 and 256, got 257`, `config.yaml:5: sharding.key: must be uid or namespace, got "name"`}},
		{"checkpoint natsKV on a webhook", "cluster: prod-eu-1\n", "cluster: prod-eu-1\ncheckpoint: {natsKV: {sink: hook}}\n",
			[]string{`config.yaml:4: checkpoint.natsKV.sink: sink "hook" is not a nats sink`}},
		{"checkpoint natsKV bucket", "cluster: prod-eu-1\n", "cluster: prod-eu-1\ncheckpoint: {natsKV: {sink: bus, bucket: \"a.b\"}}\n",
			[]string{`config.yaml:4: checkpoint.natsKV.bucket: "a.b" is not a valid bucket name (letters, digits, _ and -)`}},
		{"workers negative", "      jetstream: true\n", "      jetstream: true\n    workers: -1\n",
			[]string{`config.yaml:9: sinks[0].workers: must be between 1 and 256 (or 0: adaptive concurrency), got -1`}},
		{"workers too many", "      jetstream: true\n", "      jetstream: true\n    workers: 300\n",
			[]string{`config.yaml:9: sinks[0].workers: must be between 1 and 256 (or 0: adaptive concurrency), got 300`}},
		{"concurrency max zero", "      jetstream: true\n", "      jetstream: true\n    concurrency: {max: 0}\n",
			[]string{`config.yaml:9: sinks[0].concurrency.max: must be between 1 and 256, got 0`}},
		{"workers and concurrency", "      jetstream: true\n", "      jetstream: true\n    workers: 4\n    concurrency: {max: 16}\n",
			[]string{`config.yaml:10: sinks[0].concurrency: set either workers (a fixed number of batches in flight) or concurrency (adaptive), not both`}},
		{"dead-letter with both destinations", "      jetstream: true\n", "      jetstream: true\n    deadLetter: {file: /x, nats: {sink: bus, subject: dead}}\n",
			[]string{`config.yaml:9: sinks[0].deadLetter: set exactly one of file and nats`}},
		{"dead-letter on a webhook sink", "      jetstream: true\n", "      jetstream: true\n    deadLetter: {nats: {sink: hook, subject: dead.x}}\n",
			[]string{`config.yaml:9: sinks[0].deadLetter.nats.sink: sink "hook" is not a nats sink`}},
		{"dead-letter wildcard subject", "      jetstream: true\n", "      jetstream: true\n    deadLetter: {nats: {sink: bus, subject: \"dead.>\"}}\n",
			[]string{`config.yaml:9: sinks[0].deadLetter.nats.subject: "dead.>" is not a valid subject to publish to (no wildcards, spaces or empty tokens)`}},
		{"stream without jetstream", "      jetstream: true\n", "      stream: {name: K8S}\n",
			[]string{`config.yaml:8: sinks[0].nats.stream: needs jetstream: true`}},
		{"stream storage", "      jetstream: true\n", "      jetstream: true\n      stream: {name: K8S, storage: disk}\n",
			[]string{`config.yaml:9: sinks[0].nats.stream.storage: must be file or memory, got "disk"`}},
		{"merge keys", "  - name: archive\n", "  - <<: {name: x}\n    name: archive\n",
			[]string{`config.yaml:12: sinks[2]: merge keys (<<) are not supported`}},
		{"yaml syntax", "kind: BridgeConfig\n", "kind: BridgeConfig\n  bad: indent\n",
			[]string{`config.yaml:3: invalid YAML: mapping values are not allowed in this context`}},
		{"two documents", "rules:\n", "---\nrules:\n",
			[]string{`config.yaml:14: more than one YAML document; a config file holds exactly one`}},
	}
	if len(cases) < 30 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := mutate(t, base, tc.old, tc.new)
			cfg, warnings, err := Parse("config.yaml", []byte(doc), types)
			var got []string
			var cerr *Error
			if errors.As(err, &cerr) {
				for _, p := range cerr.Problems {
					got = append(got, p.Format("config.yaml"))
				}
			} else if err != nil {
				t.Fatalf("error of type %T: %v", err, err)
			}
			for _, w := range warnings {
				got = append(got, w.Format("config.yaml"))
			}
			if cfg != nil || err == nil {
				t.Fatalf("config accepted, want errors %q", tc.want)
			}
			if !matchAll(got, tc.want) {
				t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// A sink's expressions reading owners or involved (mute.where,
// updateWindow.key) are checked against each rule feeding the sink: a
// rule without include: [owners], or not on Events for involved, is named.
func TestSinkExpressionsNeedEveryRulesOwners(t *testing.T) {
	doc := func(include string) string {
		return `apiVersion: kubebridge.io/v1alpha1
kind: BridgeConfig
cluster: c
sinks:
  - name: slack
    webhook: {url: "https://hooks.slack.com/services/T0/B0/X", preset: slack}
    updateWindow: {every: 10m, key: "involved.name + '/' + owners[0].name"}
    mute:
      windows: [{from: "22:00", to: "07:00"}]
      where: "involved.labels.team == 'a'"
rules:
  - name: ev
    resource: v1/events
    sinks: [slack]` + include + `
  - name: pods
    resource: v1/pods
    include: [owners]
    sinks: [slack]
`
	}
	_, _, err := Parse("config.yaml", []byte(doc("")), types)
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("accepted: %v", err)
	}
	var got []string
	for _, p := range cerr.Problems {
		got = append(got, p.Format("config.yaml"))
	}
	want := []string{
		`config.yaml:7: sinks[0].updateWindow.key: reads owners, which rule "ev" resolves only with include: [owners] (add owners to its include)`,
		`config.yaml:7: sinks[0].updateWindow.key: reads involved, which only Kubernetes Events have (v1/events, events.k8s.io/v1/events), not v1/pods of rule "pods"`,
		`config.yaml:10: sinks[0].mute.where: reads involved, which rule "ev" resolves only with include: [owners] (add owners to its include)`,
		`config.yaml:10: sinks[0].mute.where: reads involved, which only Kubernetes Events have (v1/events, events.k8s.io/v1/events), not v1/pods of rule "pods"`,
	}
	if !matchAll(got, want) {
		t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	// Every rule resolving them (and none on another resource): valid.
	ok := strings.Replace(doc("\n    include: [owners]"), "  - name: pods\n    resource: v1/pods\n", "  - name: pods\n    resource: events.k8s.io/v1/events\n", 1)
	if _, _, err := Parse("config.yaml", []byte(ok), types); err != nil {
		t.Errorf("rejected: %v", err)
	}
}

func TestDocumentShapes(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"", "c.yaml: empty config"},
		{"# only a comment\n", "c.yaml: empty config"},
		{"- a\n- b\n", "c.yaml:1: expected a mapping (apiVersion, kind, cluster, sinks, rules), got a list"},
		{"hello", `c.yaml:1: expected a mapping (apiVersion, kind, cluster, sinks, rules), got "hello"`},
	} {
		_, _, err := Parse("c.yaml", []byte(tc.doc), types)
		if err == nil || err.Error() != tc.want {
			t.Errorf("Parse(%q) = %v, want %q", tc.doc, err, tc.want)
		}
	}
}

// Every problem is reported at once, in file order, not just the first.
func TestAllErrorsAtOnce(t *testing.T) {
	doc := strings.NewReplacer(
		"cluster: prod-eu-1", "cluster: ''",
		"jetstream: true", "jetstream: 3",
		"resource: apps/v1/deployments", "resource: deployments",
		"sinks: [hook]", "sinks: [hok]",
	).Replace(base)
	_, _, err := Parse("c.yaml", []byte(doc), types)
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("err = %v", err)
	}
	want := []string{
		`c.yaml:3: cluster: required: the name stamped on every event (e.g. prod-eu-1)`,
		`c.yaml:8: sinks[0].nats.jetstream: expected true or false, got "3"`,
		`c.yaml:9: warning: sinks[1]: sink "hook" is not used by any rule`,
		`c.yaml:16: rules[0].resource: "deployments" is not group/version/resource (e.g. apps/v1/deployments) or core version/resource (e.g. v1/configmaps)`,
		`c.yaml:22: rules[1].sinks[0]: unknown sink "hok" (have: bus, hook, archive)`,
	}
	if got := err.Error(); got != strings.Join([]string{want[0], want[1], want[3], want[4]}, "\n") {
		t.Errorf("error:\n%s", got)
	}
}

func TestWarningsDoNotStopLoading(t *testing.T) {
	doc := mutate(t, base, "      url: https://hooks.example.com/k8s\n", "      url: https://hooks.example.com/k8s\n      tls: {insecureSkipVerify: true}\n")
	doc = mutate(t, doc, "    sinks: [hook]\n", "    sinks: [hook]\n    allowSecretData: true\n    events: [added]\n    changed: [data]\n")
	cfg, warnings, err := Parse("c.yaml", []byte(doc), types)
	if err != nil || cfg == nil {
		t.Fatalf("err = %v", err)
	}
	var got []string
	for _, w := range warnings {
		got = append(got, w.Format("c.yaml"))
	}
	want := []string{
		`c.yaml:12: warning: sinks[1].webhook.tls.insecureSkipVerify: server certificates are not verified; anyone on the path can read and alter events`,
		`c.yaml:24: warning: rules[1].allowSecretData: has no effect on v1/configmaps (only v1/secrets is redacted)`,
		`c.yaml:26: warning: rules[1].changed: has no effect: events does not include updated`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("warnings:\n  %s", strings.Join(got, "\n  "))
	}
}

// Aliases that expand exponentially end in an error, quickly.
func TestAliasBombIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	doc := base + "\n" + strings.Replace(b.String(), "a8: &a8", "sinks2: &a8", 1)
	doc = strings.Replace(doc, "rules:\n", "x: *a8\nrules:\n", 1)
	start := time.Now()
	_, _, err := Parse("c.yaml", []byte(doc), types)
	if err == nil {
		t.Fatal("accepted")
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("took %s", time.Since(start))
	}
}

// Every example config in config/ loads without errors or warnings.
func TestExamplesAreValid(t *testing.T) {
	files, err := filepath.Glob("../../config/*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		_, warnings, err := Load(f, types)
		if err != nil {
			t.Errorf("%v", err)
		}
		for _, w := range warnings {
			t.Errorf("%s", w.Format(f))
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, _, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), types)
	if err == nil || !strings.HasSuffix(err.Error(), "nope.yaml: cannot read config: no such file or directory") {
		t.Errorf("err = %v", err)
	}
}

func mutate(t *testing.T, doc, old, new string) string {
	t.Helper()
	if strings.Count(doc, old) != 1 {
		t.Fatalf("%q occurs %d times in the document, want once", old, strings.Count(doc, old))
	}
	return strings.Replace(doc, old, new, 1)
}

func mustParse(t *testing.T, doc string) *Config {
	t.Helper()
	cfg, _, err := Parse("config.yaml", []byte(doc), types)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// matchAll reports whether got and want hold the same problems in any
// order; a want ending in "…" matches by prefix.
func matchAll(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	used := make([]bool, len(got))
outer:
	for _, w := range want {
		prefix, isPrefix := strings.CutSuffix(w, "…")
		for i, g := range got {
			if !used[i] && (g == w || isPrefix && strings.HasPrefix(g, prefix)) {
				used[i] = true
				continue outer
			}
		}
		return false
	}
	return true
}

// pingConfig is a sink type's config as a component defines it.
type pingConfig struct {
	Target string   `yaml:"target"`
	Every  Duration `yaml:"every"`
}

func (c *pingConfig) SetDefaults() { c.Every = Duration(time.Second) }

func (c *pingConfig) Validate() error {
	if c.Target == "" {
		return ErrorAt("target", "required")
	}
	return nil
}

// A sink type added as a component owns its config: the loader decodes its
// block strictly with its defaults, and its Validate reports with the
// block's paths and lines, like the built-in types.
func TestSinkTypeOwnsItsConfig(t *testing.T) {
	reg, err := sinks.NewRegistry(append(components.Sinks(), sinks.Factory{
		Type:      "ping",
		NewConfig: func() any { c := &pingConfig{}; c.SetDefaults(); return c },
		Create:    func(context.Context, sinks.Settings) (sinks.Sink, error) { return nil, errors.New("not in this test") },
	})...)
	if err != nil {
		t.Fatal(err)
	}
	doc := mutate(t, base, "    file: {path: /tmp/events.jsonl}", "    ping:\n      target: db\n")
	cfg, _, err := Parse("c.yaml", []byte(doc), reg)
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Sinks[2]; s.Type != "ping" || s.Spec.(*pingConfig).Target != "db" || s.Spec.(*pingConfig).Every.D() != time.Second {
		t.Errorf("sink = %+v spec %+v", s, s.Spec)
	}
	for _, tc := range []struct{ block, want string }{
		{"    ping:\n      every: 2s\n", "c.yaml:13: sinks[2].ping.target: required"},
		{"    ping:\n      target: db\n      evry: 2s\n", `c.yaml:15: sinks[2].ping.evry: unknown field (did you mean "every"?)`},
		{"    ping: {target: db, every: soon}\n", `c.yaml:13: sinks[2].ping.every: invalid duration "soon" (want e.g. 200ms, 5s, 1h)`},
	} {
		_, _, err := Parse("c.yaml", []byte(mutate(t, base, "    file: {path: /tmp/events.jsonl}", tc.block)), reg)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: err = %v, want %s", tc.block, err, tc.want)
		}
	}
	// Without the component, the same config names the types there are.
	if _, _, err := Parse("c.yaml", []byte(doc), types); err == nil || !strings.Contains(err.Error(), `sinks[2].ping: unknown field or sink type (known: `) {
		t.Errorf("err = %v", err)
	}
}
