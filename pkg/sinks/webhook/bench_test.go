package webhook

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/config"
	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks/sinkstest"
)

// Batched webhook delivery to a local receiver (httptest, same process),
// 100 events of a ~1 KiB object per request, against a raw net/http client
// posting the same batch bodies prepared in advance.

func receiverServer(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusAccepted)
	}))
	b.Cleanup(srv.Close)
	return srv
}

func benchBatch() []*event.Event {
	src := sinkstest.NewSource(700)
	out := make([]*event.Event, 100)
	for i := range out {
		out[i] = src.Next(i)
	}
	return out
}

func BenchmarkSinkBatch(b *testing.B) {
	srv := receiverServer(b)
	s, err := New(&Config{URL: srv.URL, Mode: "binary", Timeout: config.Duration(5 * time.Second),
		Batch: &Batch{MaxEvents: 100}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(context.Background())
	evs := benchBatch()
	start, n := time.Now(), 0
	for b.Loop() {
		if err := s.Send(context.Background(), evs); err != nil {
			b.Fatal(err)
		}
		n += len(evs)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "events/s")
}

func BenchmarkRawBatch(b *testing.B) {
	srv := receiverServer(b)
	var body bytes.Buffer
	body.WriteByte('[')
	for i, e := range benchBatch() {
		if i > 0 {
			body.WriteByte(',')
		}
		enc, _ := e.Structured()
		body.Write(enc)
	}
	body.WriteByte(']')
	client := &http.Client{Timeout: 5 * time.Second}
	start, n := time.Now(), 0
	for b.Loop() {
		resp, err := client.Post(srv.URL, "application/cloudevents-batch+json", bytes.NewReader(body.Bytes()))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		n += 100
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "events/s")
}
