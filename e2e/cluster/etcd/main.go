// Command etcd is the etcd server of the release go.mod pins, built here so
// the test cluster needs nothing but the Go module proxy. It is etcd's own
// entry point: etcdmain parses the flags and runs the server.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
