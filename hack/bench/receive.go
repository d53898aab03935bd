package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"
)

// collector counts the events a receiver got (unique by id) and how long
// each took from the bridge observing the change (the event's time, set
// in the informer handler) to arriving here.
type collector struct {
	mu      sync.Mutex
	ids     map[string]struct{}
	lat     []time.Duration
	byType  map[string][]time.Duration // added, updated, deleted (the id's suffix)
	dups    int
	last    time.Time
	arrived chan struct{} // signalled (non-blocking) on every delivery
}

func newCollector() *collector {
	return &collector{ids: map[string]struct{}{}, byType: map[string][]time.Duration{}, arrived: make(chan struct{}, 1)}
}

func (c *collector) record(id string, at time.Time, now time.Time) {
	c.mu.Lock()
	if _, seen := c.ids[id]; seen {
		c.dups++
	} else {
		c.ids[id] = struct{}{}
		c.lat = append(c.lat, now.Sub(at))
		t := id[strings.LastIndexByte(id, '.')+1:]
		c.byType[t] = append(c.byType[t], now.Sub(at))
	}
	c.last = now
	c.mu.Unlock()
	select {
	case c.arrived <- struct{}{}:
	default:
	}
}

func (c *collector) unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}

// ceTimes is what a receiver reads of a structured event.
type ceTimes struct {
	ID   string    `json:"id"`
	Time time.Time `json:"time"`
}

// natsReceiver subscribes to every kubebridge subject on the server. For
// JetStream the stream and this subscription see the same publish.
func natsReceiver(url string, c *collector) (func(), error) {
	nc, err := natsgo.Connect(url)
	if err != nil {
		return nil, err
	}
	sub, err := nc.Subscribe("k8s.>", func(m *natsgo.Msg) {
		now := time.Now()
		at, _ := time.Parse(time.RFC3339Nano, m.Header.Get("ce-time"))
		c.record(m.Header.Get("ce-id"), at, now)
	})
	if err == nil {
		err = sub.SetPendingLimits(-1, -1) // a slow bench must not drop messages
	}
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	return nc.Close, nil
}

// webhookReceiver accepts CloudEvents batches (and single structured
// events) and answers 204 at once.
func webhookReceiver(c *collector) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var evs []ceTimes
		if bytes.HasPrefix(body, []byte("[")) {
			err = json.Unmarshal(body, &evs)
		} else {
			var e ceTimes
			err = json.Unmarshal(body, &e)
			evs = append(evs, e)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, e := range evs {
			c.record(e.ID, e.Time, now)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
}

// fileReceiver follows a file sink's output, polling every millisecond
// (so its latencies include up to 1 ms of polling), until stop is closed.
func fileReceiver(path string, c *collector, stop <-chan struct{}) error {
	var f *os.File
	for f == nil {
		var err error
		if f, err = os.Open(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if f == nil {
			select {
			case <-stop:
				return nil
			case <-time.After(time.Millisecond):
			}
		}
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var partial []byte
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			partial = append(partial, line...)
		}
		if err == nil {
			var e ceTimes
			if json.Unmarshal(partial, &e) == nil {
				c.record(e.ID, e.Time, time.Now())
			}
			partial = partial[:0]
			continue
		}
		if err != io.EOF {
			return err
		}
		select {
		case <-stop:
			return nil
		case <-time.After(time.Millisecond):
		}
	}
}
