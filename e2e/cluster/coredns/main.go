// Command coredns is CoreDNS with only the plugins a cluster's DNS needs, for
// the test cluster's image. Upstream's own main links every plugin through
// core/plugin; here each plugin package is imported for its init, which
// registers it with Caddy, and the server runs only the directives that are
// registered, in the order upstream executes them.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// linked names the plugins imported above: a Corefile may use only these.
var linked = map[string]bool{
	"cache": true, "errors": true, "forward": true, "health": true, "kubernetes": true,
	"loadbalance": true, "loop": true, "ready": true, "reload": true,
}

func main() {
	// Keep upstream's execution order (each plugin sees only those after it),
	// restricted to what this binary links.
	var order []string
	for _, name := range dnsserver.Directives {
		if linked[name] {
			order = append(order, name)
		}
	}
	dnsserver.Directives = order
	coremain.Run()
}
