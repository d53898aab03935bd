#!/usr/bin/env bash
# Builds the test bed's real components from Go modules, at pinned versions:
#   etcd            hack/tools/etcd (go.etcd.io/etcd/server/v3)
#   kube-apiserver  hack/tools/kube (k8s.io/kubernetes + its staging modules)
#   kube-controller-manager  hack/tools/kube
#   kubectl         hack/tools/kube
#   helm            helm.sh/helm/v4/cmd/helm@$HELM_VERSION
#   alertmanager    github.com/prometheus/alertmanager/cmd/alertmanager@$ALERTMANAGER_VERSION
#                   (v0.32+ embed UI assets the module lacks)
# into a cache folder keyed by those versions and the Go toolchain, and points
# <repo>/.tools (git-ignored) at it. When nothing changed it only relinks.
# Prebuilt binaries are never downloaded.
set -euo pipefail

KUBE_VERSION=v1.37.1   # must match hack/tools/kube/go.mod
HELM_VERSION=v4.3.1
ALERTMANAGER_VERSION=v0.31.1

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache_root=${KUBEBRIDGE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubebridge/tools}

key=$( { cat "$here/kube/go.mod" "$here/kube/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum" "$here/etcd/main.go";
         echo "$KUBE_VERSION $HELM_VERSION"; go version; } | sha256sum | cut -c1-16)
dir="$cache_root/$key"

if [ ! -f "$dir/.complete" ]; then
  echo "building test tools into $dir (cold: about 5 minutes)"
  mkdir -p "$dir"
  start=$(date +%s)

  echo "  etcd"
  (cd "$here/etcd" && go build -o "$dir/etcd" .)

  echo "  kube-apiserver, kube-controller-manager, kubectl ($KUBE_VERSION)"
  minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  (cd "$here/kube" && go build -o "$dir/" \
     -ldflags "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
     k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl)

  echo "  helm ($HELM_VERSION)"
  (cd "$dir" && GOBIN="$dir" GOFLAGS= go install \
     -ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
     "helm.sh/helm/v4/cmd/helm@$HELM_VERSION")

  for b in etcd kube-apiserver kube-controller-manager kubectl helm; do
    [ -x "$dir/$b" ] || { echo "missing $dir/$b after build" >&2; exit 1; }
  done
  printf 'kube %s\nhelm %s\n%s\n' "$KUBE_VERSION" "$HELM_VERSION" "$(go version)" > "$dir/.complete"
  echo "built in $(( $(date +%s) - start ))s"
fi

# Added to the same folder when missing (a cache built before it had none).
if [ ! -x "$dir/alertmanager" ]; then
  echo "  alertmanager ($ALERTMANAGER_VERSION)"
  (cd "$dir" && GOBIN="$dir" GOFLAGS= go install \
     "github.com/prometheus/alertmanager/cmd/alertmanager@$ALERTMANAGER_VERSION")
  [ -x "$dir/alertmanager" ] || { echo "missing $dir/alertmanager after build" >&2; exit 1; }
fi

ln -sfn "$dir" "$repo/.tools"
echo "test tools: $repo/.tools -> $dir"
