// Package admin serves a bridge's admin endpoints: health, readiness,
// metrics and /replay, with /replay's authorization (a TokenReview and a
// SubjectAccessReview, as kube-rbac-proxy does) and its limits. It sees the
// bridge through Target only.
package admin

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Target is what the admin API needs of a bridge.
type Target interface {
	// Checks are what /readyz reports, in order.
	Checks() []Check
	// ReplayRules lists the rules a replay of sink (of rule only, when
	// set) covers; an error says why there is none to replay (HTTP 404).
	ReplayRules(sink, rule string) ([]string, error)
	// Replay queues the whole view of rule to sink again, as updated with
	// kbreplay "resync", and returns how many events that sends.
	Replay(sink, rule string) int
}

// Options configure the admin API.
type Options struct {
	Target Target
	// Metrics serves /metrics.
	Metrics http.Handler
	// REST reaches the cluster that reviews /replay's callers; nil: every
	// caller is refused with 503.
	REST *rest.Config
	// Namespace is where /replay permissions are checked.
	Namespace string
	Logger    *slog.Logger
}

// Server is the admin API of one bridge.
type Server struct {
	opts    Options
	replays replayGate
}

// New returns the admin API of opts.Target.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts}
	s.replays.limit = rate.NewLimiter(rate.Every(10*time.Second), 3)
	s.replays.reviews = rate.NewLimiter(10, 20)
	return s
}

// Handler serves the admin endpoints:
//
//	/healthz  200 while the process serves
//	/readyz   200 once the caches synced and the checkpoint was reconciled,
//	          and while every sink can deliver; ?verbose lists each check
//	/metrics  Prometheus metrics (per-sink counts, queue depth, latency, ...)
//	/replay   POST ?sink=S[&rule=R]: queue the full view to one sink
//
// /healthz, /readyz and /metrics are open (probes and scrapers). /replay
// changes what sinks receive, so it is served to authenticated callers
// only (see authorize), one replay at a time and rate limited. It can be
// served before the bridge started (readyz then says 503).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", s.serveReady)
	mux.Handle("/metrics", s.opts.Metrics)
	mux.HandleFunc("/replay", s.serveReplay)
	return mux
}

// Check is one line of /readyz: a failed check with Degraded set is
// reported but keeps the bridge ready (a rule waiting for its resource is
// a state of the cluster the bridge handles, not a fault of the bridge).
type Check struct {
	Name     string
	Err      error
	Degraded bool
}

// serveReady answers 503 while a check fails (not a degraded one), with
// the failing checks; ?verbose lists them all, as kube-apiserver does.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	_, verbose := r.URL.Query()["verbose"]
	var out strings.Builder
	ready := true
	for _, c := range s.opts.Target.Checks() {
		switch {
		case c.Err == nil:
			if verbose {
				fmt.Fprintf(&out, "[+]%s ok\n", c.Name)
			}
		case c.Degraded:
			fmt.Fprintf(&out, "[!]%s degraded: %s\n", c.Name, oneLine(c.Err.Error()))
		default:
			ready = false
			fmt.Fprintf(&out, "[-]%s failed: %s\n", c.Name, oneLine(c.Err.Error()))
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, out.String())
		fmt.Fprintln(w, "readyz check failed")
		return
	}
	fmt.Fprint(w, out.String())
	fmt.Fprintln(w, "ok")
}

// oneLine keeps an error on its line of /readyz, printable.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 512 {
		s = s[:512] + "..."
	}
	return s
}

// ReplayProgress is one line of a /replay response.
type ReplayProgress struct {
	Rule   string `json:"rule,omitempty"`
	Queued int    `json:"queued"`
	Done   bool   `json:"done,omitempty"`
	Error  string `json:"error,omitempty"`
}

// serveReplay reconciles the sink's rule views (or one rule's) and queues
// every object in them again as updated with kbreplay "resync", streaming
// progress as JSON lines.
func (s *Server) serveReplay(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	sink, ruleName := r.URL.Query().Get("sink"), r.URL.Query().Get("rule")
	user, code, msg := s.authorize(r, sink)
	if code != http.StatusOK {
		if code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kubebridge"`)
		}
		http.Error(w, msg, code)
		return
	}
	rules, err := s.opts.Target.ReplayRules(sink, ruleName)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if !s.replays.running.TryLock() {
		http.Error(w, "a replay is running; try again when it is done", http.StatusTooManyRequests)
		return
	}
	defer s.replays.running.Unlock()
	if !s.replays.limit.Allow() {
		w.Header().Set("Retry-After", "10")
		http.Error(w, "too many replays; try again later", http.StatusTooManyRequests)
		return
	}
	s.opts.Logger.Info("replay requested", "user", user, "sink", sink, "rule", ruleName)
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	total := 0
	for _, rule := range rules {
		n := s.opts.Target.Replay(sink, rule)
		total += n
		_ = enc.Encode(ReplayProgress{Rule: rule, Queued: n})
		flush()
	}
	_ = enc.Encode(ReplayProgress{Queued: total, Done: true})
	s.opts.Logger.Info("replay queued", "sink", sink, "rule", ruleName, "events", total)
}

// ReplayResource is what a caller of /replay must be allowed to create, in
// the bridge's namespace, named after the sink (so a Role can grant replays
// of some sinks only): verb create on replays.kubebridge.io.
var ReplayResource = authorizationv1.ResourceAttributes{Group: "kubebridge.io", Resource: "replays", Verb: "create"}

// replayGate is the state of /replay: who may call it is the cluster's
// RBAC; how often is this.
type replayGate struct {
	running sync.Mutex    // one replay at a time: each sends a sink its whole view
	limit   *rate.Limiter // and not in a loop
	reviews *rate.Limiter // TokenReviews + SubjectAccessReviews asked of the apiserver
	clients clientLimits  // and per client address, so one client cannot use them all
	once    sync.Once
	client  kubernetes.Interface
	err     error

	mu      sync.Mutex
	decided map[[32]byte]decision // by sha256 of token and sink, for reviewTTL
}

// clientLimits are the per-client limits of token reviews: a client whose
// tokens are not cached (new or invalid ones) gets one review a second,
// five at once, so that a flood from one address leaves the shared
// budget to the others. At most 4,096 clients are tracked (then it starts
// over: a bound on memory, not on any one client).
type clientLimits struct {
	mu  sync.Mutex
	per map[string]*rate.Limiter
}

func (c *clientLimits) allow(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.per[addr]
	if l == nil {
		if c.per == nil || len(c.per) >= 4096 {
			c.per = map[string]*rate.Limiter{}
		}
		l = rate.NewLimiter(1, 5)
		c.per[addr] = l
	}
	return l.Allow()
}

// clientAddr is the caller's IP (its port changes per connection).
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// decision is a cached answer of authorize.
type decision struct {
	user  string
	code  int
	msg   string
	until time.Time
}

// reviewTTL is how long an answer of the apiserver about a token stands:
// callers that retry, or flood, do not each cost it two reviews.
const reviewTTL = 10 * time.Second

// authorize checks the caller of r the way kube-rbac-proxy does: its bearer
// token through a TokenReview, then a SubjectAccessReview of
// ReplayResource named sink in the bridge's namespace. It returns the
// user, or the status (401: no valid token, 403: not allowed, 503: the
// cluster could not be asked) and why.
func (s *Server) authorize(r *http.Request, sink string) (user string, code int, msg string) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		return "", http.StatusUnauthorized, "a bearer token is required (bridge replay --token-file)"
	}
	g := &s.replays
	key := sha256.Sum256([]byte(strings.TrimSpace(token) + "\x00" + sink))
	if d, ok := g.cached(key); ok {
		return d.user, d.code, d.msg
	}
	if !g.clients.allow(clientAddr(r)) || !g.reviews.Allow() {
		return "", http.StatusTooManyRequests, "too many authentication attempts; try again later"
	}
	user, code, msg = s.review(r, g, token, sink)
	if code != http.StatusServiceUnavailable {
		g.remember(key, decision{user: user, code: code, msg: msg, until: time.Now().Add(reviewTTL)})
	}
	return user, code, msg
}

func (g *replayGate) cached(key [32]byte) (decision, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	d, ok := g.decided[key]
	if ok && time.Now().After(d.until) {
		delete(g.decided, key)
		ok = false
	}
	return d, ok
}

func (g *replayGate) remember(key [32]byte, d decision) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.decided == nil || len(g.decided) >= 1024 { // bounded: start over rather than grow
		g.decided = map[[32]byte]decision{}
	}
	g.decided[key] = d
}

// review asks the apiserver who holds token and whether they may replay
// to sink (see authorize).
func (s *Server) review(r *http.Request, g *replayGate, token, sink string) (user string, code int, msg string) {
	g.once.Do(func() {
		if s.opts.REST == nil {
			g.err = errors.New("no cluster connection")
			return
		}
		g.client, g.err = kubernetes.NewForConfig(s.opts.REST)
	})
	if g.err != nil {
		return "", http.StatusServiceUnavailable, "cannot check the token: " + g.err.Error()
	}
	ctx := r.Context()
	tr, err := g.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: strings.TrimSpace(token)}}, metav1.CreateOptions{})
	if err != nil {
		s.opts.Logger.Warn("TokenReview failed", "error", err)
		return "", http.StatusServiceUnavailable, "cannot check the token"
	}
	if !tr.Status.Authenticated {
		return "", http.StatusUnauthorized, "the token is not valid"
	}
	u := tr.Status.User
	attrs := ReplayResource
	attrs.Namespace, attrs.Name = s.opts.Namespace, sink
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := g.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra, ResourceAttributes: &attrs}},
		metav1.CreateOptions{})
	if err != nil {
		s.opts.Logger.Warn("SubjectAccessReview failed", "error", err)
		return "", http.StatusServiceUnavailable, "cannot check the permission"
	}
	if !sar.Status.Allowed {
		s.opts.Logger.Warn("replay refused", "user", u.Username, "sink", sink)
		return u.Username, http.StatusForbidden, fmt.Sprintf("%s may not create replays.kubebridge.io %q in namespace %q", u.Username, sink, s.opts.Namespace)
	}
	return u.Username, http.StatusOK, ""
}
