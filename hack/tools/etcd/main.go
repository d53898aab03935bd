// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 for the
// kubebridge test bed. `go install go.etcd.io/etcd/server/v3@…` is refused
// (the module has replace directives), so this tiny module calls etcdmain
// with the server, api, client and pkg modules pinned to one version.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
