package bridgecmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/features"
	"k8s.io/client-go/rest"
)

// --kube-cbor decides when given; otherwise client-go's own environment
// variable does; otherwise CBOR is on. Both commands that watch have it.
func TestKubeCBORDecision(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		env     string // "" for unset
		want    bool
		from    string
		wantErr string
	}{
		{want: true, from: "default"},
		{args: []string{"--kube-cbor=false"}, want: false, from: "--kube-cbor"},
		{args: []string{"--kube-cbor"}, want: true, from: "--kube-cbor"},
		{env: "false", want: false, from: kubeCBOREnv},
		{env: "true", want: true, from: kubeCBOREnv},
		{args: []string{"--kube-cbor=false"}, env: "true", want: false, from: "--kube-cbor"},
		{args: []string{"--kube-cbor=true"}, env: "false", want: true, from: "--kube-cbor"},
		{env: "maybe", wantErr: kubeCBOREnv + `="maybe": want true or false`},
	} {
		for _, cmd := range []*cobra.Command{newRunCommand(nil), newReplayCommand(nil)} { // flags only: no sink types
			name := cmd.Name() + " " + strings.Join(tc.args, " ") + " env=" + tc.env
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			env := func(k string) (string, bool) {
				if k == kubeCBOREnv && tc.env != "" {
					return tc.env, true
				}
				return "", false
			}
			on, from, err := kubeCBOR(cmd.Flags(), env)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Errorf("%s: err = %v, want %q", name, err, tc.wantErr)
				}
				continue
			}
			if err != nil || on != tc.want || from != tc.from {
				t.Errorf("%s: got %v from %q (err %v), want %v from %q", name, on, from, err, tc.want, tc.from)
			}
		}
	}
}

// An apiserver stand-in that serves a ConfigMap list in CBOR to a client
// that accepts it and in JSON to one that does not, as kube-apiserver does.
func cborOrJSONServer(t *testing.T) (*httptest.Server, func() []string) {
	t.Helper()
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMapList", "metadata": map[string]any{"resourceVersion": "7"}}}
	list.Items = []unstructured.Unstructured{{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "a", "namespace": "default", "resourceVersion": "7"}, "data": map[string]any{"k": "v"}}}}
	var mu sync.Mutex
	var served []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		ct := "application/json"
		if strings.Contains(r.Header.Get("Accept"), "application/cbor") {
			ct = "application/cbor"
			if err := cbor.NewSerializer(nil, nil).Encode(list, &body); err != nil {
				t.Errorf("encoding CBOR: %v", err)
			}
		} else if err := json.NewEncoder(&body).Encode(list); err != nil {
			t.Errorf("encoding JSON: %v", err)
		}
		mu.Lock()
		served = append(served, ct)
		mu.Unlock()
		w.Header().Set("Content-Type", ct)
		_, _ = w.Write(body.Bytes())
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), served...)
	}
}

// The flag reaches client-go: with CBOR on, a dynamic client built after
// applyKubeCBOR asks for CBOR and decodes it; with --kube-cbor=false it
// asks for JSON only.
func TestApplyKubeCBORSwitchesTheDynamicClient(t *testing.T) {
	was := features.FeatureGates().Enabled(features.ClientsAllowCBOR)
	t.Cleanup(func() {
		if err := setClientsAllowCBOR(was); err != nil {
			t.Error(err)
		}
	})
	t.Setenv(kubeCBOREnv, "") // restored when the test ends
	if err := os.Unsetenv(kubeCBOREnv); err != nil {
		t.Fatal(err)
	}
	srv, served := cborOrJSONServer(t)
	cm := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	for i, tc := range []struct {
		args []string
		want string
	}{
		{nil, "application/cbor"},
		{[]string{"--kube-cbor=false"}, "application/json"},
		{[]string{"--kube-cbor=true"}, "application/cbor"},
	} {
		cmd := newRunCommand(nil) // flags only
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		if _, _, err := applyKubeCBOR(cmd.Flags()); err != nil {
			t.Fatal(err)
		}
		dyn, err := dynamic.NewForConfig(&rest.Config{Host: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		l, err := dyn.Resource(cm).Namespace("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatalf("%v: list: %v", tc.args, err)
		}
		if len(l.Items) != 1 || l.Items[0].GetName() != "a" || l.Items[0].Object["data"].(map[string]any)["k"] != "v" {
			t.Errorf("%v: decoded %v", tc.args, l.Items)
		}
		if got := served(); len(got) != i+1 || got[i] != tc.want {
			t.Errorf("%v: the server answered %v, want %s last", tc.args, got, tc.want)
		}
	}
}

// A bad KUBE_FEATURE_ClientsAllowCBOR stops the bridge before it starts
// (exit 2), rather than being ignored with a log line as client-go does.
func TestRunRefusesABadKubeCBOREnv(t *testing.T) {
	cmd := runBridgeEnv(t, []string{kubeCBOREnv + "=maybe"}, "run", "--config", "/nonexistent.yaml")
	if cmd.code != 2 || !strings.Contains(cmd.stderr, kubeCBOREnv+`="maybe": want true or false`) {
		t.Errorf("bad env: %+v", cmd)
	}
	if r := runBridge(t, "run", "--config", "/nonexistent.yaml", "--kube-cbor=perhaps"); r.code != 2 || !strings.Contains(r.stderr, "--kube-cbor") {
		t.Errorf("bad flag: %+v", r)
	}
}

// runBridgeEnv is runBridge with more environment variables.
func runBridgeEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bridgeBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running bridge: %v", err)
	}
	return result{code, stdout.String(), stderr.String()}
}
