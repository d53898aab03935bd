package testenv

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ControlPlane is a real etcd and kube-apiserver on loopback ports, with an
// admin identity (a static token in group system:masters), RBAC
// authorization and service-account token signing (TokenRequest works).
// There is no controller-manager unless a test starts one
// (StartControllerManager): otherwise nothing reconciles, namespaces stay
// Terminating when deleted, Deployments never get ReplicaSets.
type ControlPlane struct {
	Dir      string // holds data, certificates, keys, logs and the kubeconfig
	EtcdURL  string
	Host     string // https://127.0.0.1:<port>
	Token    string // the admin's bearer token
	CAData   []byte // trusts the apiserver's self-signed serving certificate
	toolsDir string
	opts     ControlPlaneOptions

	apiPort int
	mu      sync.Mutex
	etcd    *process
	api     *process
}

// Readiness bounds: the apiserver is ready in a few seconds here.
const (
	etcdReadyTimeout = 30 * time.Second
	apiReadyTimeout  = 90 * time.Second
	stopTimeout      = 20 * time.Second
)

// ControlPlaneOptions changes how the apiserver is started. The zero value
// is the plain control plane every other test uses.
type ControlPlaneOptions struct {
	// FeatureGates are passed to kube-apiserver as --feature-gates (joined
	// with commas), e.g. "CBORServingAndStorage=true". They apply to every
	// start of the apiserver: StartAPIServer, RestartAPIServer and the
	// second apiserver of WhileAPIServerDown.
	FeatureGates []string
}

// StartControlPlane starts etcd and kube-apiserver for one test and stops
// them when it ends. It skips or fails the test when the tools are missing
// (see SkipOrFail).
func StartControlPlane(t testing.TB) *ControlPlane {
	t.Helper()
	return StartControlPlaneWithOptions(t, ControlPlaneOptions{})
}

// StartControlPlaneWithOptions is StartControlPlane with options, for tests
// that need an apiserver configured unlike the shared one.
func StartControlPlaneWithOptions(t testing.TB, o ControlPlaneOptions) *ControlPlane {
	t.Helper()
	dir, err := ToolsDir()
	if err != nil {
		SkipOrFail(t, err)
	}
	cp, err := NewControlPlaneWithOptions(dir, t.TempDir(), o)
	if err != nil {
		t.Fatalf("starting control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping control plane: %v", err)
		}
	})
	return cp
}

// NewControlPlane starts etcd and kube-apiserver with the binaries in
// toolsDir and state in dir. The caller must call Stop.
func NewControlPlane(toolsDir, dir string) (*ControlPlane, error) {
	return NewControlPlaneWithOptions(toolsDir, dir, ControlPlaneOptions{})
}

// NewControlPlaneWithOptions is NewControlPlane with options.
func NewControlPlaneWithOptions(toolsDir, dir string, o ControlPlaneOptions) (*ControlPlane, error) {
	token, err := randomHex(16)
	if err != nil {
		return nil, err
	}
	o.FeatureGates = append([]string(nil), o.FeatureGates...) // the caller may reuse its slice
	cp := &ControlPlane{Dir: dir, Token: token, toolsDir: toolsDir, opts: o}
	if err := cp.writeAuthFiles(); err != nil {
		return nil, err
	}
	if err := cp.startEtcd(); err != nil {
		return nil, err
	}
	if err := cp.StartAPIServer(); err != nil {
		_ = cp.Stop()
		return nil, err
	}
	return cp, nil
}

func (cp *ControlPlane) writeAuthFiles() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(cp.Dir, "sa.key"), keyPEM, 0o600); err != nil {
		return err
	}
	tokens := fmt.Sprintf("%s,kubebridge-admin,kubebridge-admin,\"system:masters\"\n", cp.Token)
	return os.WriteFile(filepath.Join(cp.Dir, "tokens.csv"), []byte(tokens), 0o600)
}

func (cp *ControlPlane) startEtcd() error {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // a chosen port can be taken before etcd binds it
		client, peer := FreePort(), FreePort()
		cp.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(client)
		peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
		dataDir := filepath.Join(cp.Dir, "etcd")
		_ = os.RemoveAll(dataDir)
		var err error
		cp.etcd, err = startProcess("etcd", filepath.Join(cp.toolsDir, "etcd"), []string{
			"--name=testenv",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + cp.EtcdURL,
			"--advertise-client-urls=" + cp.EtcdURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=testenv=" + peerURL,
			"--unsafe-no-fsync",
			"--log-level=warn",
		}, filepath.Join(cp.Dir, "etcd.log"))
		if err != nil {
			return err
		}
		lastErr = waitReady(cp.etcd, etcdReadyTimeout, func() bool {
			resp, err := http.Get(cp.EtcdURL + "/health")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		if lastErr == nil {
			return nil
		}
		_ = cp.etcd.stop(stopTimeout)
	}
	return lastErr
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) on the
// same port and etcd, so clients see a restart: watches break and relist.
func (cp *ControlPlane) StartAPIServer() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.api != nil {
		return errors.New("apiserver already running")
	}
	fixedPort := cp.apiPort != 0
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port := cp.apiPort
		if !fixedPort {
			port = FreePort()
		}
		api, err := cp.startAPIServerOn(port)
		if err == nil {
			cp.api, cp.apiPort = api, port
			cp.Host = hostOf(port)
			return nil
		}
		lastErr = err
		if fixedPort {
			break
		}
	}
	return lastErr
}

func hostOf(port int) string { return "https://127.0.0.1:" + strconv.Itoa(port) }

// startAPIServerOn starts a kube-apiserver on port and waits until it is ready.
func (cp *ControlPlane) startAPIServerOn(port int) (*process, error) {
	api, err := startProcess("kube-apiserver", filepath.Join(cp.toolsDir, "kube-apiserver"), cp.apiServerArgs(port),
		filepath.Join(cp.Dir, "kube-apiserver-"+strconv.Itoa(port)+".log"))
	if err != nil {
		return nil, err
	}
	if err := waitReady(api, apiReadyTimeout, func() bool { return cp.ready(hostOf(port)) }); err != nil {
		_ = api.stop(stopTimeout)
		return nil, err
	}
	return api, nil
}

// apiServerArgs are kube-apiserver's flags for a start on port.
func (cp *ControlPlane) apiServerArgs(port int) []string {
	args := []string{
		"--etcd-servers=" + cp.EtcdURL,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(cp.Dir, "apiserver-certs"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(cp.Dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(cp.Dir, "sa.key"),
		"--token-auth-file=" + filepath.Join(cp.Dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		"--profiling=false",
		"--shutdown-watch-termination-grace-period=2s", // open watches must not hold a stop
		"--v=1",
	}
	if len(cp.opts.FeatureGates) > 0 {
		args = append(args, "--feature-gates="+strings.Join(cp.opts.FeatureGates, ","))
	}
	return args
}

// WhileAPIServerDown stops the apiserver that clients know, runs f with an
// admin config for a second apiserver on another port over the same etcd
// (so the cluster changes while every watch on the first is broken), stops
// the second and starts the first again.
func (cp *ControlPlane) WhileAPIServerDown(t testing.TB, f func(alt *rest.Config)) {
	t.Helper()
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	port := FreePort()
	alt, err := cp.startAPIServerOn(port)
	if err != nil {
		t.Fatalf("starting the second apiserver: %v", err)
	}
	rc := cp.RESTConfig()
	rc.Host = hostOf(port)
	f(rc)
	if err := alt.stop(stopTimeout); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartAPIServer(); err != nil {
		t.Fatalf("restarting the apiserver: %v", err)
	}
}

// ready reports whether the apiserver answers /readyz and has created the
// default namespace (done by a loop inside the apiserver, just after ready).
func (cp *ControlPlane) ready(host string) bool {
	ca, err := os.ReadFile(filepath.Join(cp.Dir, "apiserver-certs", "apiserver.crt"))
	if err != nil {
		return false
	}
	cp.CAData = ca
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return false
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	for _, path := range []string{"/readyz", "/api/v1/namespaces/default"} {
		req, _ := http.NewRequest(http.MethodGet, host+path, nil)
		req.Header.Set("Authorization", "Bearer "+cp.Token)
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
	}
	return true
}

// StopAPIServer stops kube-apiserver, leaving etcd and its data in place.
func (cp *ControlPlane) StopAPIServer() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.api == nil {
		return nil
	}
	err := cp.api.stop(stopTimeout)
	cp.api = nil
	return err
}

// RestartAPIServer stops and starts kube-apiserver.
func (cp *ControlPlane) RestartAPIServer() error {
	if err := cp.StopAPIServer(); err != nil {
		return err
	}
	return cp.StartAPIServer()
}

// Stop stops kube-apiserver and etcd. It is safe to call more than once.
func (cp *ControlPlane) Stop() error {
	errAPI := cp.StopAPIServer()
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var errEtcd error
	if cp.etcd != nil {
		errEtcd = cp.etcd.stop(stopTimeout)
		cp.etcd = nil
	}
	return errors.Join(errAPI, errEtcd)
}

// RESTConfig returns a new admin client config.
func (cp *ControlPlane) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            cp.Host,
		BearerToken:     cp.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.CAData},
		QPS:             1000,
		Burst:           2000,
	}
}

// Clientset returns a typed admin client.
func (cp *ControlPlane) Clientset(t testing.TB) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// Kubeconfig writes a kubeconfig for the admin into dir and returns its path.
func (cp *ControlPlane) Kubeconfig(dir string) (string, error) {
	return cp.writeKubeconfig(filepath.Join(dir, "admin.kubeconfig"), "kubebridge-admin", cp.Token)
}

func (cp *ControlPlane) writeKubeconfig(path, user, token string) (string, error) {
	return writeKubeconfigFor(path, cp.Host, cp.CAData, user, token)
}

// writeKubeconfigFor writes a kubeconfig for user (a bearer token) of the
// apiserver at server, trusted through caData, to path.
func writeKubeconfigFor(path, server string, caData []byte, user, token string) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["testenv"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: user, Namespace: "default"}
	kc.CurrentContext = "testenv"
	return path, clientcmd.WriteToFile(*kc, path)
}

// waitReady polls ready until it holds, the process exits or timeout passes.
func waitReady(p *process, timeout time.Duration, ready func() bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if ready() {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%v); last log lines:\n%s", p.name, p.err, p.logTail())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s; last log lines:\n%s", p.name, timeout, p.logTail())
		case <-tick.C:
		}
	}
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
