package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubebridge/kubebridge/pkg/event"
	"github.com/kubebridge/kubebridge/pkg/sinks"
)

// The receiver below is the one docs/sinks.md shows (Verifying signatures,
// Refusing stale writes): TestDocsShowTheTestedReceiver keeps them the same.

// verify checks a request's v3 signature: the timestamp, the method, the
// request target (path and query, as sent), the ce-* and Kubebridge-Fence
// headers and the body.
func verify(secret []byte, r *http.Request, body []byte, now time.Time) error {
	sig := map[string]string{}
	for _, part := range strings.Split(r.Header.Get("X-Kubebridge-Signature"), ",") {
		k, v, _ := strings.Cut(part, "=")
		sig[k] = v
	}
	sec, err := strconv.ParseInt(sig["t"], 10, 64)
	if err != nil {
		return fmt.Errorf("bad timestamp %q", sig["t"])
	}
	if d := now.Sub(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return errors.New("stale timestamp")
	}
	var lines []string
	for name, values := range r.Header {
		if name = strings.ToLower(name); strings.HasPrefix(name, "ce-") || name == "kubebridge-fence" {
			if len(values) != 1 {
				return fmt.Errorf("header %s repeated", name) // an appended copy would not be signed
			}
			lines = append(lines, name+":"+values[0]+"\n")
		}
	}
	sort.Strings(lines)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(sig["t"] + "\n" + r.Method + "\n" + r.RequestURI + "\n" + strings.Join(lines, "") + "\n"))
	mac.Write(body)
	got, err := hex.DecodeString(sig["v3"])
	if err != nil || !hmac.Equal(got, mac.Sum(nil)) {
		return errors.New("signature mismatch")
	}
	return nil
}

// fences keeps the highest epoch each shard's requests carried and
// refuses lower ones: a replica that gave a shard up cannot write after
// the replica that took it over did.
type fences struct {
	mu      sync.Mutex
	highest map[string]uint64 // by "shard/shards"
}

// apply runs write unless the request's Kubebridge-Fence token (already
// verified) is older than one seen for its shard; the check and the write
// hold one lock, so a stale request cannot slip in between.
func (f *fences) apply(token string, write func() error) (stale bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if token == "" {
		return false, write() // a bridge running alone sends none
	}
	var shard, epoch string
	for _, part := range strings.Split(token, ";") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "shard":
			shard = v
		case "epoch":
			epoch = v
		}
	}
	e, err := strconv.ParseUint(epoch, 10, 64)
	if shard == "" || err != nil {
		return false, fmt.Errorf("bad fence %q", token)
	}
	if e < f.highest[shard] {
		return true, nil
	}
	if err := write(); err != nil {
		return false, err
	}
	f.highest[shard] = e
	return false, nil
}

func receive(secret []byte, f *fences, write func(r *http.Request, body []byte) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 16<<20))
		if err != nil {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		if err := verify(secret, r, body, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		stale, err := f.apply(r.Header.Get("Kubebridge-Fence"), func() error { return write(r, body) })
		switch {
		case stale:
			http.Error(w, "stale fencing token", http.StatusConflict) // kubebridge neither retries nor dead-letters it
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
}

// signedSink is a webhook sink with a signing secret: a shaped request
// DELETE /items/<name> unless request says otherwise.
func signedSink(t *testing.T, url string, r *Request) *Sink {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "hmac")
	if err := os.WriteFile(secret, []byte("s3cr3t-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r == nil {
		r = &Request{Method: http.MethodDelete, Path: `'items/' + object.metadata.name`, Query: map[string]string{"rv": `object.metadata.resourceVersion`}}
	}
	return shaped(t, url, r, func(c *Config) { c.SigningSecretFile = secret })
}

// The capture: eight DELETEs to /items/item-1..8 in one second
// carried the same signature (v2 signs no method, path or query), so one
// captured request validated as any of them. v3 differs for each and
// validates only as itself: another path, query, method or fencing token
// fails.
func TestSignatureV3CoversTheRequest(t *testing.T) {
	var mu sync.Mutex
	var reqs []*http.Request
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		reqs, bodies = append(reqs, r.Clone(context.Background())), append(bodies, body)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	s := signedSink(t, srv.URL, nil)
	s.now = func() time.Time { return time.Unix(1_800_000_000, 0) } // one second for all
	ctx := sinks.WithFence(context.Background(), sinks.Fence{Shard: 3, Shards: 16, Epoch: 7})
	for i := 1; i <= 8; i++ {
		if err := s.Send(ctx, []*event.Event{pod("prod", fmt.Sprint("item-", i), "Failed", "")}); err != nil {
			t.Fatal(err)
		}
	}
	secret, now := []byte("s3cr3t-key"), time.Unix(1_800_000_000, 0)
	v3s := map[string]bool{}
	for i, r := range reqs {
		if err := verify(secret, r, bodies[i], now); err != nil {
			t.Fatalf("request %d (%s %s): %v", i, r.Method, r.RequestURI, err)
		}
		if r.Header.Get(FenceHeader) != "shard=3/16;epoch=7" {
			t.Errorf("fence header %q", r.Header.Get(FenceHeader))
		}
		sig := r.Header.Get(SignatureHeader)
		v3s[sig[strings.Index(sig, "v3="):]] = true
	}
	if len(reqs) != 8 || len(v3s) != 8 {
		t.Fatalf("%d requests, %d distinct v3 signatures", len(reqs), len(v3s))
	}
	captured := reqs[0]
	for name, forge := range map[string]func(r *http.Request){
		"another path":  func(r *http.Request) { r.RequestURI = "/items/item-2?rv=7" },
		"another query": func(r *http.Request) { r.RequestURI = "/items/item-1?rv=8" },
		"another method": func(r *http.Request) {
			r.Method = http.MethodPut
		},
		"a newer fence":  func(r *http.Request) { r.Header.Set(FenceHeader, "shard=3/16;epoch=9") },
		"a second fence": func(r *http.Request) { r.Header.Add(FenceHeader, "shard=3/16;epoch=9") },
	} {
		r := captured.Clone(context.Background())
		r.RequestURI = captured.RequestURI
		forge(r)
		if err := verify(secret, r, bodies[0], now); err == nil {
			t.Errorf("the captured DELETE of /items/item-1 verified with %s", name)
		}
	}
}

// docs/sinks.md's receiver, run: a request under an older epoch than one
// its shard already wrote with is refused (409), which the sink reports as
// fenced (neither delivered nor dead-lettered); a forged token fails the
// signature; a bridge running alone sends none and is taken.
func TestReceiverRefusesStaleFence(t *testing.T) {
	var mu sync.Mutex
	var written []string
	f := &fences{highest: map[string]uint64{}}
	srv := httptest.NewServer(receive([]byte("s3cr3t-key"), f, func(r *http.Request, _ []byte) error {
		mu.Lock()
		written = append(written, r.URL.Path+" "+r.Header.Get(FenceHeader))
		mu.Unlock()
		return nil
	}))
	defer srv.Close()
	s := signedSink(t, srv.URL, &Request{Method: http.MethodPut, Path: `'items/' + object.metadata.name`})
	// The replica under epoch 7 lost the shard to epoch 8: from then on
	// its own fence fails.
	lost := errors.New("shard 3: lease last renewed 12s ago")
	successor := false
	send := func(epoch uint64) error {
		ctx := context.Background()
		if epoch > 0 {
			valid := func() error { return nil }
			if epoch < 8 && successor {
				valid = func() error { return lost }
			}
			ctx = sinks.WithFence(ctx, sinks.Fence{Shard: 3, Shards: 16, Epoch: epoch, Valid: valid})
		}
		return s.Send(ctx, []*event.Event{pod("prod", "x", "Failed", "")})
	}
	if err := send(7); err != nil {
		t.Fatal(err)
	}
	if err := send(8); err != nil { // the successor took the shard over
		t.Fatal(err)
	}
	successor = true
	err := send(7) // the old owner's late request
	if !sinks.IsFenced(err) || !strings.Contains(err.Error(), "409") || !strings.Contains(err.Error(), "epoch=7") || s.FenceRefusals() != 1 {
		t.Errorf("a stale epoch: %v (%d refusals counted), want refused by the fence, counted", err, s.FenceRefusals())
	}
	if err := send(0); err != nil {
		t.Errorf("no fence (running alone): %v", err)
	}
	// A 409 to a replica whose fence holds is the receiver's own
	// conflict, not the fence's: classed as any answer.
	conflict := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusConflict) }))
	defer conflict.Close()
	c := signedSink(t, conflict.URL, &Request{Method: http.MethodPut, Path: `'items/' + object.metadata.name`})
	held := sinks.WithFence(context.Background(), sinks.Fence{Shard: 3, Shards: 16, Epoch: 9, Valid: func() error { return nil }})
	if err := c.Send(held, []*event.Event{pod("prod", "x", "Failed", "")}); err == nil || sinks.IsFenced(err) {
		t.Errorf("the receiver's own 409 to a replica that holds its shard: %v, want a failure that is not the fence's", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := "[/items/x shard=3/16;epoch=7 /items/x shard=3/16;epoch=8 /items/x ]"; fmt.Sprint(written) != want {
		t.Errorf("written %v, want %s", written, want)
	}
}

// The receiver code in docs/sinks.md is this file's.
func TestDocsShowTheTestedReceiver(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/sinks.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("receiver_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range []string{"func verify(", "type fences struct", "func (f *fences) apply(", "func receive("} {
		i := strings.Index(string(src), fn)
		if i < 0 {
			t.Fatalf("%s not in receiver_test.go", fn)
		}
		body := string(src[i:])
		body = body[:strings.Index(body, "\n}\n")+3]
		if !strings.Contains(string(doc), body) {
			t.Errorf("docs/sinks.md does not show receiver_test.go's\n%s", body)
		}
	}
}
