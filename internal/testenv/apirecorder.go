package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
)

// APIExchange is one request through an APIRecorder: what the client asked
// for and what the apiserver answered.
type APIExchange struct {
	Method, Path, RawQuery string
	Accept                 string // the request's Accept header
	UserAgent              string
	Status                 int
	ContentType            string // the apiserver's response Content-Type
}

// Watch reports whether the exchange was a watch request.
func (e APIExchange) Watch() bool {
	q, _ := url.ParseQuery(e.RawQuery)
	return q.Get("watch") == "true" || q.Get("watch") == "1"
}

// APIRecorder is a TLS reverse proxy on loopback in front of a control
// plane's apiserver that records every exchange. Tests point a client at it
// (Kubeconfig) to see what went over the wire, e.g. which encoding the
// apiserver chose for that client's lists and watches. It follows the
// apiserver across StopAPIServer/StartAPIServer.
type APIRecorder struct {
	URL    string // https://127.0.0.1:<port>
	CAData []byte // trusts the recorder's serving certificate

	cp  *ControlPlane
	srv *httptest.Server

	mu  sync.Mutex
	log []APIExchange
}

// StartAPIRecorder starts an APIRecorder for cp, closed when the test ends.
func StartAPIRecorder(t testing.TB, cp *ControlPlane) *APIRecorder {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cp.CAData) {
		t.Fatal("api recorder: the control plane's CA data holds no certificate")
	}
	r := &APIRecorder{cp: cp}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			target, err := url.Parse(cp.host())
			if err != nil { // cannot happen: Host is built by hostOf
				target = &url.URL{Scheme: "https", Host: "127.0.0.1:1"}
			}
			pr.SetURL(target)
			pr.Out.Host = target.Host
		},
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true},
		FlushInterval: -1, // watches stream
		ModifyResponse: func(resp *http.Response) error {
			r.record(resp.Request, resp.StatusCode, resp.Header.Get("Content-Type"))
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			r.record(req, http.StatusBadGateway, "")
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	r.srv = httptest.NewTLSServer(proxy)
	r.URL = r.srv.URL
	r.CAData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.srv.Certificate().Raw})
	t.Cleanup(func() {
		r.srv.CloseClientConnections() // open watches would hold Close
		r.srv.Close()
	})
	return r
}

func (r *APIRecorder) record(req *http.Request, status int, contentType string) {
	e := APIExchange{Method: req.Method, Path: req.URL.Path, RawQuery: req.URL.RawQuery, Accept: req.Header.Get("Accept"),
		UserAgent: req.Header.Get("User-Agent"), Status: status, ContentType: contentType}
	r.mu.Lock()
	r.log = append(r.log, e)
	r.mu.Unlock()
}

// Exchanges returns the exchanges so far, oldest first.
func (r *APIRecorder) Exchanges() []APIExchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]APIExchange(nil), r.log...)
}

// Kubeconfig writes a kubeconfig for the admin that talks to the apiserver
// through the recorder into dir and returns its path.
func (r *APIRecorder) Kubeconfig(dir string) (string, error) {
	return writeKubeconfigFor(filepath.Join(dir, "recorded.kubeconfig"), r.URL, r.CAData, "kubebridge-admin", r.cp.Token)
}

// host is the apiserver's current address.
func (cp *ControlPlane) host() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.Host
}
