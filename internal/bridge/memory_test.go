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
// drains leaves it waiting until the deliveries stop, when it returns.
func TestSettleWaitsForTheQueuesToDrain(t *testing.T) {
	for _, drain := range []bool{true, false} {
		t.Run(fmt.Sprintf("drain=%v", drain), func(t *testing.T) {
			ctx := context.Background()
			ts := &testSinks{hold: make(chan struct{})}
			var log syncBuffer
			d := testDeliverer(ts.registry(t), slog.New(slog.NewTextHandler(&log, nil)), nil)
			cfg := &config.Config{Sinks: []config.Sink{sinkCfg("a", "1")}}
			if err := d.start(ctx, cfg, cfg.Sinks); err != nil {
				t.Fatal(err)
			}
			run := d.runs()[0]
			for i := range 20 {
				run.delivery.Offer(testEvent(fmt.Sprint("o", i)))
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				ctx, cancel := d.lifetime()
				defer cancel()
				d.returnStartMemory(ctx)
			}()
			time.Sleep(3 * memoryPoll)
			select {
			case <-done:
				t.Fatal("returnStartMemory returned while 20 events were queued")
			default:
			}
			const returned = "start-up memory returned to the OS"
			if strings.Contains(log.String(), returned) {
				t.Fatal("memory returned while the sink still held the start's events")
			}
			if drain {
				close(ts.hold)
			} else {
				d.end()
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("returnStartMemory did not return")
			}
			if got := strings.Contains(log.String(), returned); got != drain {
				t.Errorf("memory returned = %v, want %v; log:\n%s", got, drain, log.String())
			}
			if !drain {
				close(ts.hold)
			}
			if _, err := d.stop(cancelled(), false); err != nil {
				t.Error(err)
			}
		})
	}
}
