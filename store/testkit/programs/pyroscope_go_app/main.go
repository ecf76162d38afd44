// Profiles itself with the real pyroscope-go SDK and uploads to
// SERVER_URL, as a Go service would: static tags in the application name
// (`name=app{k=v,...}`), one multipart `/ingest` request per profile type,
// and dynamic tags (`endpoint`) as pprof sample labels. kiln-testkit's
// real_inputs runs it against a recorder; the store tests replay what it
// sent.
//
// Usage: pyroscope_go_app SERVER_URL APP_NAME SECONDS
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/grafana/pyroscope-go"
)

var sink []byte

//go:noinline
func kilnGoA(until time.Time) uint64 {
	var acc uint64
	for time.Now().Before(until) {
		for i := uint64(0); i < 100000; i++ {
			acc = acc*31 + i
		}
	}
	return acc
}

//go:noinline
func kilnGoB(until time.Time) {
	for time.Now().Before(until) {
		sink = make([]byte, 1<<16)
		for i := range sink {
			sink[i] = byte(i)
		}
	}
}

func run(server, app string, seconds float64) error {
	profiler, err := pyroscope.Start(pyroscope.Config{
		ApplicationName: app,
		ServerAddress:   server,
		UploadRate:      time.Second,
		// A `/` in a value travels inside `name=`.
		Tags: map[string]string{"env": "ci", "scope": "com.grafana.pyroscope/go"},
		// CPU and heap, the types the captured clients send, and goroutines,
		// whose uploads carry sampleRate=0.
		ProfileTypes: []pyroscope.ProfileType{
			pyroscope.ProfileCPU,
			pyroscope.ProfileAllocSpace,
			pyroscope.ProfileInuseSpace,
			pyroscope.ProfileGoroutines,
		},
	})
	if err != nil {
		return err
	}
	half := time.Duration(seconds * float64(time.Second) / 2)
	pyroscope.TagWrapper(context.Background(), pyroscope.Labels("endpoint", "/a"), func(context.Context) {
		kilnGoA(time.Now().Add(half))
	})
	pyroscope.TagWrapper(context.Background(), pyroscope.Labels("endpoint", "/b"), func(context.Context) {
		kilnGoB(time.Now().Add(half))
	})
	// Flush waits for the uploads; Stop alone may end before them.
	profiler.Flush(true)
	return profiler.Stop()
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: pyroscope_go_app SERVER_URL APP_NAME SECONDS")
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[3], 64)
	if err == nil {
		err = run(os.Args[1], os.Args[2], seconds)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
