package tail

import (
	"bytes"
	"context"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

const updated = `{"specversion":"1.0","id":"u.7.updated","source":"kubebridge/demo","type":"io.kubebridge.deployments.apps.updated","subject":"demo/web","time":"2026-11-21T20:00:00.5Z","kbrule":"deps","kbcluster":"demo","data":{"object":{},"patch":[{"op":"replace","path":"/metadata/resourceVersion","value":"7"},{"op":"replace","path":"/spec/replicas","value":3},{"op":"remove","path":"/metadata/labels/x"}]}}`

func TestFormat(t *testing.T) {
	got := Format("k8s.demo.apps.deployments.demo.web.updated", []byte(updated))
	ts := time.Date(2026, 11, 21, 20, 0, 0, 5e8, time.UTC).Local().Format("15:04:05.000")
	want := ts + " updated  deployments.apps             demo/web  (rule deps)\n    ~ /spec/replicas: 3\n    - /metadata/labels/x\n"
	if got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	if got := Format("x", []byte("nope")); got != "?? x: not a kubebridge event (4 bytes)\n" {
		t.Errorf("junk: %q", got)
	}
}

func TestRunCountsCoreMessages(t *testing.T) {
	srv := testenv.StartNATS(t)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		done <- Run(ctx, Options{URL: srv.ClientURL(), Subject: "k8s.>", Count: 2}, &out)
	}()
	defer func() { cancel(); <-exited }() // Run ends with ctx, also when the test fails before it returned
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	deadline := time.After(5 * time.Second)
	for sent := 0; ; sent++ { // publish until tail, subscribing concurrently, has seen two
		_ = nc.Publish("k8s.demo.apps.deployments.demo.web.updated", []byte(updated))
		_ = nc.Publish("other.subject", []byte(updated))
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(out.Bytes(), []byte("demo/web")); n != 2 {
				t.Errorf("printed %d events:\n%s", n, out.String())
			}
			return
		case <-deadline:
			t.Fatal("tail did not stop after --count 2")
		case <-time.After(50 * time.Millisecond):
		}
	}
}
