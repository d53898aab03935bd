package bridge

import (
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/kubebridge/kubebridge/internal/kubejson"
)

// Clients are the Kubernetes clients a bridge works with (Options.Clients):
// built from Options.REST by default, client-go's fakes in unit tests of
// the runtime's lifecycle.
type Clients struct {
	// Kube asks discovery, checks access (preflight) and holds the Leases.
	Kube kubernetes.Interface
	// Dynamic lists and watches the rules' resources.
	Dynamic dynamic.Interface
	// Metadata lists and watches the owners' metadata (include owners);
	// nil: rules that include owners name them from their references.
	Metadata metadata.Interface
	// Leases returns the client of the shard Leases and member Pods,
	// limited to qps and burst (sharding renews a Lease per shard every
	// retry period); nil: Kube.
	Leases func(qps float32, burst int) (kubernetes.Interface, error)
}

// clientsFor builds the clients of rc.
func clientsFor(rc *rest.Config) (*Clients, error) {
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamicFor(rc)
	if err != nil {
		return nil, err
	}
	md, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &Clients{Kube: kube, Dynamic: dyn, Metadata: md, Leases: func(qps float32, burst int) (kubernetes.Interface, error) {
		lrc := rest.CopyConfig(rc)
		lrc.QPS, lrc.Burst = qps, burst
		return kubernetes.NewForConfig(lrc)
	}}, nil
}

// dynamicFor is dynamic.NewForConfig's client, whose JSON watch streams
// are decoded in one pass per event (kubejson.Serializer): the same
// objects, in a sixth of the CPU (the decoding is most of what a cold
// start on a JSON apiserver costs).
func dynamicFor(rc *rest.Config) (dynamic.Interface, error) {
	cfg := dynamic.ConfigFor(rc)
	cfg.NegotiatedSerializer = kubejson.Serializer(cfg.NegotiatedSerializer)
	cfg.GroupVersion = nil // every request of the dynamic client names its path (AbsPath)
	h, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	client, err := rest.UnversionedRESTClientForConfigAndClient(cfg, h)
	if err != nil {
		return nil, err
	}
	return dynamic.New(client), nil
}

// leases is the client of the shard Leases for qps and burst.
func (c *Clients) leases(qps float32, burst int) (kubernetes.Interface, error) {
	if c.Leases == nil {
		return c.Kube, nil
	}
	return c.Leases(qps, burst)
}

// clients returns the bridge's clients: Options.Clients, or built from
// Options.REST at first use.
func (b *Bridge) clients() (*Clients, error) {
	b.clientsOnce.Do(func() {
		if b.opts.Clients != nil {
			b.clientsVal = b.opts.Clients
			return
		}
		b.clientsVal, b.clientsErr = clientsFor(b.opts.REST)
	})
	return b.clientsVal, b.clientsErr
}
