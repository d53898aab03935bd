package nats

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/kubebridge/kubebridge/pkg/event"
)

// fill counts the encoded size itself to spare nats.go's own count per
// event; it must never count less than nats.go, or an event over the
// server's max_payload would be published and the server would close the
// connection. At exactly the limit an event goes; one byte less refuses it.
func TestFillSizeMatchesClient(t *testing.T) {
	srv := startServer(t, 0)
	for _, js := range []bool{false, true} {
		c := sinkConfig(srv.ClientURL(), js)
		c.Stream = nil
		s, err := Connect(context.Background(), "bus", c, nil)
		must(t, err)
		defer s.Close(context.Background())
		for _, e := range []*event.Event{
			ev("prod", "a", 1, 10),
			ev("prod", "ünï code", 2, 300),
			ev("", "node-1", 3, 0).WithReplay(event.ReplayResync),
			event.Build(testRule, event.Transition{Change: event.Deleted, Object: ev("prod", "b", 4, 5).Object(), Reason: "unmatched", Replay: event.ReplayCheckpoint}),
		} {
			msg := s.getMsg()
			_, err := s.fill(msg, e, nil, 0, nil)
			must(t, err)
			exact := int64(msg.Size() - len(msg.Subject))
			if _, err := s.fill(msg, e, nil, exact, nil); err != nil {
				t.Errorf("jetstream=%v %s: refused at exactly the limit (%d): %v", js, e.ID, exact, err)
			}
			if _, err := s.fill(msg, e, nil, exact-1, nil); err == nil {
				t.Errorf("jetstream=%v %s: %d bytes went under a limit of %d", js, e.ID, exact, exact-1)
			}
		}
	}
}

// Messages are reused: an event without kbreplay or kbreason after one
// with them carries none, with core NATS and with JetStream.
func TestReusedMessagesCarryNoStaleHeaders(t *testing.T) {
	srv := startServer(t, 0)
	for _, js := range []bool{false, true} {
		t.Run("jetstream="+strconv.FormatBool(js), func(t *testing.T) {
			nc, err := natsgo.Connect(srv.ClientURL())
			must(t, err)
			defer nc.Close()
			var mu sync.Mutex
			got := map[string]natsgo.Header{}
			received := 0
			sub, err := nc.Subscribe("k8s.>", func(m *natsgo.Msg) {
				mu.Lock()
				got[m.Header.Get("ce-id")] = m.Header
				received++
				mu.Unlock()
				if m.Reply != "" { // stand in for a stream
					_ = m.Respond([]byte(`{"stream":"FAKE","seq":1}`))
				}
			})
			must(t, err)
			defer sub.Unsubscribe()
			must(t, nc.Flush())
			c := sinkConfig(srv.ClientURL(), js)
			c.Stream = nil
			s, err := Connect(context.Background(), "bus", c, nil)
			must(t, err)
			defer s.Close(context.Background())
			marked := event.Build(testRule, event.Transition{Change: event.Deleted, Object: ev("prod", "a", 1, 5).Object(), Reason: "unmatched", Replay: event.ReplayCheckpoint})
			plain := ev("prod", "b", 2, 5)
			for _, batch := range [][]*event.Event{{marked, plain}, {marked}, {plain}} {
				must(t, s.Send(context.Background(), batch))
			}
			// The subscription's callback runs on its own goroutine: wait
			// for the 4 messages sent, not only for the connection's flush.
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				mu.Lock()
				n := received
				mu.Unlock()
				if n >= 4 || time.Now().After(deadline) {
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if received != 4 {
				t.Fatalf("subscriber received %d messages, want 4", received)
			}
			if h := got[marked.ID]; h.Get("ce-kbreplay") != "checkpoint" || h.Get("ce-kbreason") != "unmatched" {
				t.Errorf("marked event's headers: %v", h)
			}
			if h := got[plain.ID]; h == nil || h.Get("ce-kbreplay") != "" || h.Get("ce-kbreason") != "" || h.Get("ce-subject") != "prod/b" {
				t.Errorf("plain event's headers: %v", h)
			}
			if h := got[plain.ID]; js != (h.Get("Nats-Msg-Id") == plain.ID) {
				t.Errorf("Nats-Msg-Id %q with jetstream=%v", h.Get("Nats-Msg-Id"), js)
			}
		})
	}
}
