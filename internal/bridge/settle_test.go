package bridge

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
)

// syncBuffer is a bytes.Buffer safe for a logger and a reader at once.
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

// The start's memory is returned only once the sinks delivered what the
// start queued (before, the events still hold it), and a sink that never
// drains leaves settle waiting until the deliveries stop, when it returns.
func TestSettleWaitsForTheQueuesToDrain(t *testing.T) {
	for _, drain := range []bool{true, false} {
		t.Run(fmt.Sprintf("drain=%v", drain), func(t *testing.T) {
			ctx := context.Background()
			ts := &testSinks{hold: make(chan struct{})}
			var log syncBuffer
			b := New(Options{Config: &config.Config{}, Sinks: ts.registry(t), Logger: slog.New(slog.NewTextHandler(&log, nil))})
			b.deliveryCtx, b.cancelDelivery = context.WithCancel(ctx)
			defer b.cancelDelivery()
			set, _, err := buildSinkSet(ctx, b.opts.Sinks, []config.Sink{sinkCfg("a", "1")}, nil, discard)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.startDelivery(ctx, set.order[0], nil); err != nil {
				t.Fatal(err)
			}
			b.active.Store(set)
			for i := range 20 {
				set.order[0].delivery.Offer(testEvent(fmt.Sprint("o", i)))
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				b.settle(b.deliveryCtx)
			}()
			time.Sleep(3 * settlePoll)
			select {
			case <-done:
				t.Fatal("settle returned while 20 events were queued")
			default:
			}
			const returned = "start-up memory returned to the OS"
			if strings.Contains(log.String(), returned) {
				t.Fatal("memory returned while the sink still held the start's events")
			}
			if drain {
				close(ts.hold)
			} else {
				b.cancelDelivery()
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("settle did not return")
			}
			if got := strings.Contains(log.String(), returned); got != drain {
				t.Errorf("memory returned = %v, want %v; log:\n%s", got, drain, log.String())
			}
			b.cancelDelivery()
			set.order[0].close(ctx)
			b.wg.Wait()
		})
	}
}
