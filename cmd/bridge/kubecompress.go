package main

import (
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
)

// kubeCompressionFlag is the flag that lets the apiserver gzip its answers.
const kubeCompressionFlag = "kube-compression"

// addKubeCompressionFlag registers --kube-compression on a command that
// watches the cluster.
func addKubeCompressionFlag(f *pflag.FlagSet) {
	f.Bool(kubeCompressionFlag, true, "ask the apiserver to gzip large list responses (Accept-Encoding: gzip); off saves the CPU of compressing and decompressing on both ends where the network to the apiserver is fast")
}

// applyKubeCompression sets rc's DisableCompression from --kube-compression
// (when the command has the flag; otherwise rc is left as it is).
func applyKubeCompression(f *pflag.FlagSet, rc *rest.Config) error {
	if f.Lookup(kubeCompressionFlag) == nil {
		return nil
	}
	on, err := f.GetBool(kubeCompressionFlag)
	if err != nil {
		return err
	}
	rc.DisableCompression = !on
	return nil
}
