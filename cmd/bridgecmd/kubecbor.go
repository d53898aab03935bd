package bridgecmd

import (
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/pflag"
	"k8s.io/client-go/features"
)

// kubeCBORFlag is the flag that lets the bridge's informers read CBOR.
const kubeCBORFlag = "kube-cbor"

// kubeCBOREnv is client-go's own switch for the same thing.
const kubeCBOREnv = "KUBE_FEATURE_" + string(features.ClientsAllowCBOR)

// addKubeCBORFlag registers --kube-cbor on a command that watches the cluster.
func addKubeCBORFlag(f *pflag.FlagSet) {
	f.Bool(kubeCBORFlag, true, "let the informers read CBOR from the apiserver, which decodes about twice as fast as JSON; an apiserver that does not serve CBOR (feature gate CBORServingAndStorage off) answers JSON. Unset, "+kubeCBOREnv+" decides when it is in the environment")
}

// kubeCBOR decides whether the bridge's clients accept CBOR: --kube-cbor
// when given, else KUBE_FEATURE_ClientsAllowCBOR when set (client-go's own
// switch, so an operator's env keeps working), else on. from names what
// decided, for the log.
func kubeCBOR(f *pflag.FlagSet, lookupEnv func(string) (string, bool)) (on bool, from string, err error) {
	if f.Changed(kubeCBORFlag) {
		on, err = f.GetBool(kubeCBORFlag)
		return on, "--" + kubeCBORFlag, err
	}
	if v, ok := lookupEnv(kubeCBOREnv); ok {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return false, "", fmt.Errorf("%s=%q: want true or false", kubeCBOREnv, v)
		}
		return on, kubeCBOREnv, nil
	}
	return true, "default", nil
}

// gateSetter is what client-go's default feature gates offer besides Enabled.
type gateSetter interface {
	Set(features.Feature, bool) error
}

// applyKubeCBOR sets client-go's ClientsAllowCBOR gate, process-wide, from
// --kube-cbor and the environment (see kubeCBOR). It must run before any
// client is built: the dynamic client fixes its Accept header and codecs
// when it is created. With the gate on, the dynamic client (the informers)
// sends Accept: application/json;q=0.9,application/cbor;q=1, so the
// apiserver picks: CBOR where it serves it, JSON elsewhere. Request bodies
// stay JSON (ClientsPreferCBOR is left alone), and the typed clients
// (discovery, TokenReview, SubjectAccessReview, Leases) keep their
// protobuf/JSON Accept headers.
func applyKubeCBOR(f *pflag.FlagSet) (on bool, from string, err error) {
	on, from, err = kubeCBOR(f, os.LookupEnv)
	if err != nil {
		return false, "", err
	}
	if err := setClientsAllowCBOR(on); err != nil {
		return false, "", err
	}
	return on, from, nil
}

func setClientsAllowCBOR(on bool) error {
	s, ok := features.FeatureGates().(gateSetter)
	if !ok {
		return fmt.Errorf("--%s: client-go's feature gates (%T) cannot be set", kubeCBORFlag, features.FeatureGates())
	}
	if err := s.Set(features.ClientsAllowCBOR, on); err != nil {
		return fmt.Errorf("--%s: client-go feature gate %s: %w", kubeCBORFlag, features.ClientsAllowCBOR, err)
	}
	return nil
}
