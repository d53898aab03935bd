package testenv_test

import (
	"net/http"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// cborContentType asks host for the default namespace in CBOR only and
// returns the response's status and Content-Type.
func cborContentType(t *testing.T, rc *rest.Config) (int, string) {
	t.Helper()
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, rc.Host+"/api/v1/namespaces/default", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/cbor")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Content-Type")
}

// Feature gates given at start stay on through a restart and on the second
// apiserver of WhileAPIServerDown; the shared control plane has none, so it
// refuses a CBOR-only request.
func TestFeatureGatesSurviveRestarts(t *testing.T) {
	t.Parallel()
	cp := testenv.StartControlPlaneWithOptions(t, testenv.ControlPlaneOptions{FeatureGates: []string{"CBORServingAndStorage=true"}})
	wantCBOR := func(when string, rc *rest.Config) {
		t.Helper()
		if code, ct := cborContentType(t, rc); code != http.StatusOK || ct != "application/cbor" {
			t.Errorf("%s: CBOR request got %d %q, want 200 application/cbor", when, code, ct)
		}
	}
	wantCBOR("first start", cp.RESTConfig())
	if err := cp.RestartAPIServer(); err != nil {
		t.Fatal(err)
	}
	wantCBOR("after RestartAPIServer", cp.RESTConfig())
	cp.WhileAPIServerDown(t, func(alt *rest.Config) { wantCBOR("second apiserver", alt) })
	wantCBOR("after WhileAPIServerDown", cp.RESTConfig())

	plain := testenv.SharedControlPlane(t)
	if code, _ := cborContentType(t, plain.RESTConfig()); code != http.StatusNotAcceptable {
		t.Errorf("gate-off apiserver answered a CBOR-only request with %d, want 406", code)
	}
}
