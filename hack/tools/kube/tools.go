//go:build tools

// Package kube pins the Kubernetes control-plane binaries the test bed builds
// (kube-apiserver, kube-controller-manager and kubectl). It is its own module
// so that k8s.io/kubernetes and its staging replace block never reach the
// product's go.mod.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
