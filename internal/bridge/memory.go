package bridge

import (
	"context"
	"runtime"
	"runtime/debug"
	"time"
)

// memoryPoll is how often returnStartMemory looks at the queues.
const memoryPoll = 250 * time.Millisecond

// returnStartMemory returns the start's transient memory to the OS once
// every sink delivered what the start queued (the initial view, or what
// changed while the bridge was away). Decoding the initial list, the events streamed from
// it and their encodings make the heap peak at about twice what stays
// live; the runtime hands those pages back only slowly, so without this
// the process keeps the start's peak as its resident set for minutes. It
// costs one full collection, once per start (or leadership). It reads the
// active sinks at each look (a reload may replace a sink that never
// drained); while a sink does not drain (down since the start), its events
// stay live anyway and it waits, until ctx ends. A shutdown's drain does
// not count (stop makes the set inactive first).
func (d *deliverer) returnStartMemory(ctx context.Context) {
	t := time.NewTicker(memoryPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		set := d.active.Load()
		if set == nil {
			return // stopped: a shutdown's drain is not a settling
		}
		pending := 0
		for _, d := range set.deliveries() {
			pending += d.Pending()
		}
		if pending > 0 {
			continue
		}
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		debug.FreeOSMemory()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		d.opts.Logger.Info("initial deliveries done; start-up memory returned to the OS",
			"heapLiveMiB", after.HeapAlloc>>20, "returnedMiB", int64(after.HeapReleased-before.HeapReleased)>>20)
		return
	}
}
