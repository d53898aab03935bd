package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// slowCase is one case of -slow: a webhook that takes delay per request
// (then delay2 from the middle of the load on, if set), or NATS core.
type slowCase struct {
	Name   string        `json:"case"`
	Sink   string        `json:"sink"` // webhook or nats
	Delay  time.Duration `json:"delay"`
	Delay2 time.Duration `json:"delay2,omitempty"`
}

// parseSlow reads -slow: "20ms", "20ms>200ms" (a step) or "nats", comma
// separated.
func parseSlow(spec string) ([]slowCase, error) {
	var cs []slowCase
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "nats" {
			cs = append(cs, slowCase{Name: item, Sink: "nats"})
			continue
		}
		first, second, step := strings.Cut(item, ">")
		c := slowCase{Name: item, Sink: "webhook"}
		var err error
		if c.Delay, err = time.ParseDuration(first); err != nil || c.Delay < 0 {
			return nil, fmt.Errorf("-slow: %q: want a delay (20ms), a step (20ms>200ms) or nats", item)
		}
		if step {
			if c.Delay2, err = time.ParseDuration(second); err != nil || c.Delay2 < 0 {
				return nil, fmt.Errorf("-slow: %q: want a delay (20ms), a step (20ms>200ms) or nats", item)
			}
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// inFlight is one sample of a slow run.
type inFlight struct {
	T         float64 `json:"t"`         // seconds since the load started
	DelayMs   float64 `json:"delayMs"`   // the receiver's delay per request then
	Now       int64   `json:"inFlight"`  // requests in flight at the sample
	Max       int64   `json:"max"`       // most in flight since the previous sample
	Delivered int     `json:"delivered"` // unique events received so far
}

// slowResult is one slow case's run.
type slowResult struct {
	slowCase
	Run        int     `json:"run"`
	Rate       int     `json:"rate"` // offered changes/s
	Changes    int     `json:"changes"`
	Events     int     `json:"events"` // unique events delivered
	Duplicates int     `json:"duplicates"`
	OutOfOrder int     `json:"outOfOrder"`
	Seconds    float64 `json:"seconds"` // first write to last new event
	Complete   bool    `json:"complete"`
	// LoadSeconds is how long the paced load took to write.
	LoadSeconds float64       `json:"loadSeconds"`
	P50         time.Duration `json:"p50"`
	P99         time.Duration `json:"p99"`
	Max         time.Duration `json:"max"`
	MaxInFlight int64         `json:"maxInFlight"`
	Requests    int64         `json:"requests"`
	CPU         float64       `json:"cpuSeconds"`
	Series      []inFlight    `json:"series"`
}

func (r slowResult) perSecond() float64 {
	if r.Seconds <= 0 {
		return 0
	}
	return float64(r.Events) / r.Seconds
}

func (r slowResult) String() string {
	return fmt.Sprintf("slow run %d %-12s offered %d/s: %d/%d events (%.0f/s) in %.1fs, p50 %v p99 %v, max in flight %d, %d out of order, %d duplicates, cpu %.2fs",
		r.Run, r.Name, r.Rate, r.Events, r.Changes, r.perSecond(), r.Seconds, r.P50, r.P99, r.MaxInFlight, r.OutOfOrder, r.Duplicates, r.CPU)
}

// slowRuns measures every -slow case runs times.
func (b *bed) slowRuns(o options) ([]slowResult, error) {
	cases, err := parseSlow(o.slow)
	if err != nil {
		return nil, err
	}
	if o.slowRate <= 0 || o.slowN <= 0 {
		return nil, fmt.Errorf("-slow-rate and -slow-n must be positive")
	}
	var out []slowResult
	for r := 1; r <= o.runs; r++ {
		for i, c := range cases {
			m, err := b.slowRun(o, c, fmt.Sprintf("bench-slow-%d-%d", i, r), r)
			if err != nil {
				return nil, fmt.Errorf("slow run %d, %s: %w", r, c.Name, err)
			}
			log.Print(m)
			out = append(out, m)
		}
	}
	return out, nil
}

// slowRun offers the paced load to the bridge with the sink's default
// config (no workers, no batch) and a receiver that takes c.Delay per
// request, sampling the requests in flight. It waits for every change,
// until nothing arrived for 30 s or -slow-max after the load, whichever
// comes first, and reports what arrived.
func (b *bed) slowRun(o options, c slowCase, ns string, run int) (slowResult, error) {
	res := slowResult{slowCase: c, Run: run, Rate: o.slowRate, Changes: 3 * o.slowN}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := b.namespace(ctx, ns); err != nil {
		return res, err
	}
	col := newCollector()
	var h *hook
	var sink string
	switch c.Sink {
	case "nats":
		closeSub, err := natsReceiver(b.natsURL, col)
		if err != nil {
			return res, err
		}
		defer closeSub()
		sink = "nats: {url: " + b.natsURL + "}"
	default:
		h = webhookReceiver(col)
		defer h.Close()
		h.delay.Store(int64(c.Delay))
		sink = "webhook: {url: " + h.URL + "}"
	}
	p, err := b.startBridge(ns, ruleConfig(sink, ns), false)
	if err != nil {
		return res, err
	}
	defer p.kill()
	defer os.Remove(filepath.Join(b.dir, ns+".checkpoint"))

	l := &load{cs: b.cs, ns: ns, n: o.slowN, rate: o.slowRate, workers: b.workers}
	start := time.Now()
	// The step: the receiver slows down halfway through the offered load.
	if h != nil && c.Delay2 > 0 {
		half := time.Duration(res.Changes) * time.Second / time.Duration(o.slowRate) / 2
		step := time.AfterFunc(half, func() { h.delay.Store(int64(c.Delay2)) })
		defer step.Stop()
	}
	stopSampling := make(chan struct{})
	var series []inFlight // the sampler's until it is done
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		tick := time.NewTicker(o.slowSample)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				series = append(series, sample(start, h, col))
			}
		}
	}()
	loadStart, err := l.run(ctx)
	res.LoadSeconds = time.Since(loadStart).Seconds()
	if err == nil {
		res.Complete = col.waitFor(res.Changes, 30*time.Second, time.Now().Add(o.slowMax))
	}
	close(stopSampling)
	sampling.Wait()
	if err != nil {
		return res, err
	}
	res.Series = append(series, sample(start, h, col))
	res.CPU = procCPU(p.cmd.Process.Pid)
	if !res.Complete {
		log.Printf("slow %s: stopped waiting at %d of %d events", c.Name, col.unique(), res.Changes)
		p.kill() // its queue is not drained: a graceful stop would fail
	} else if err := p.stop(); err != nil {
		return res, err
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	res.Events, res.Duplicates, res.OutOfOrder = len(col.ids), col.dups, col.outOfOrder
	res.Seconds = col.lastNew.Sub(loadStart).Seconds()
	res.P50, res.P99, res.Max = quantile(col.lat, 0.5), quantile(col.lat, 0.99), quantile(col.lat, 1)
	if h != nil {
		res.MaxInFlight, res.Requests = h.maxAll.Load(), h.requests.Load()
	}
	return res, nil
}

// sample reads the receiver's requests in flight (none for NATS) and the
// events delivered so far.
func sample(start time.Time, h *hook, c *collector) inFlight {
	s := inFlight{T: time.Since(start).Seconds(), Delivered: c.unique()}
	if h != nil {
		s.DelayMs = float64(h.delay.Load()) / 1e6
		s.Now = h.inFlight.Load()
		s.Max = max(h.maxSince.Swap(0), s.Now) // a request may span samples
	}
	return s
}
