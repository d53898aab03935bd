package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubebridge/kubebridge/pkg/mirror"
)

// syncBuffer is a bytes.Buffer safe for the informer's handler and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// value is what the nats sink stores for a ConfigMap (docs/mirror.md).
func value(ns, name, rv string) []byte {
	return []byte(`{"specversion":"1.0","id":"e-` + rv + `","source":"kubebridge","type":"io.kubebridge.updated",` +
		`"subject":"` + ns + `/` + name + `","kbrule":"r","datacontenttype":"application/json","data":{"object":` +
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"` + ns + `","name":"` + name + `","resourceVersion":"` + rv + `"}}}}`)
}

func TestConsumerPrintsTheView(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "kubebridge-r", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	put := func(ns, name, rv string) {
		t.Helper()
		if _, err := kv.Put(ctx, mirror.Key(ns, name), value(ns, name, rv)); err != nil {
			t.Fatal(err)
		}
	}
	put("default", "web", "100")
	put("default", "db.primary", "101")

	out := &syncBuffer{}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, srv.ClientURL(), "kubebridge-r", out) }()
	waitFor := func(line string) {
		t.Helper()
		for !strings.Contains(out.String(), line+"\n") {
			select {
			case <-ctx.Done():
				t.Fatalf("no %q in:\n%s", line, out)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	waitFor("added default/web (ConfigMap, resourceVersion 100)")
	waitFor("added default/db.primary (ConfigMap, resourceVersion 101)")
	put("default", "web", "102")
	waitFor("updated default/web (ConfigMap, resourceVersion 102)")
	if err := kv.Delete(ctx, mirror.Key("default", "db.primary")); err != nil {
		t.Fatal(err)
	}
	waitFor("deleted default/db.primary")
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != 4 {
		t.Errorf("%d lines, want 4:\n%s", n, out)
	}
}
