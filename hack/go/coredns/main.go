// Command coredns is CoreDNS with only the plugins a local cluster's DNS needs: the same server as
// upstream's binary (coremain), built from the pinned module without the ~60 other plugins (cloud
// DNS providers among them) that upstream's core/plugin package compiles in.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins the local node's Corefile uses (modelroll_devcluster/node.py).
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
