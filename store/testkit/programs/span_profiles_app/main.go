// Traces two root spans with the OpenTelemetry Go SDK, profiles itself with
// the real pyroscope-go SDK, and lets grafana/otel-profiling-go tag each
// span's CPU samples with its span id, as a Go service sending span
// profiles to Pyroscope does. One span runs kilnSpanSlow, the other
// kilnSpanOther; each span's id is printed on its own line
// (`slow=<id>`, `other=<id>`) for the test to ask the store for.
//
// Usage: span_profiles_app SERVER_URL APP_NAME SECONDS
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	otelpyroscope "github.com/grafana/otel-profiling-go"
	"github.com/grafana/pyroscope-go"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

var sink uint64

//go:noinline
func kilnSpanSlow(until time.Time) {
	var acc uint64
	for time.Now().Before(until) {
		for i := uint64(0); i < 100000; i++ {
			acc = acc*33 + i
		}
	}
	sink += acc
}

//go:noinline
func kilnSpanOther(until time.Time) {
	var acc uint64
	for time.Now().Before(until) {
		for i := uint64(0); i < 100000; i++ {
			acc = acc*37 ^ i
		}
	}
	sink += acc
}

// inSpan runs work in a new root span named name and prints its id.
func inSpan(label, name string, work func()) {
	_, span := otel.Tracer("kiln-span-test").Start(context.Background(), name)
	fmt.Printf("%s=%s\n", label, span.SpanContext().SpanID())
	// Start set the span's labels on this goroutine; the work runs here.
	work()
	span.End()
}

func run(server, app string, seconds float64) error {
	provider := sdktrace.NewTracerProvider()
	otel.SetTracerProvider(otelpyroscope.NewTracerProvider(provider))
	defer provider.Shutdown(context.Background())

	profiler, err := pyroscope.Start(pyroscope.Config{
		ApplicationName: app,
		ServerAddress:   server,
		UploadRate:      time.Second,
		ProfileTypes:    []pyroscope.ProfileType{pyroscope.ProfileCPU},
	})
	if err != nil {
		return err
	}
	half := time.Duration(seconds * float64(time.Second) / 2)
	inSpan("slow", "slow-request", func() { kilnSpanSlow(time.Now().Add(half)) })
	inSpan("other", "other-request", func() { kilnSpanOther(time.Now().Add(half)) })
	// Flush waits for the uploads; Stop alone may end before them.
	profiler.Flush(true)
	return profiler.Stop()
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: span_profiles_app SERVER_URL APP_NAME SECONDS")
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[3], 64)
	if err != nil || seconds <= 0 {
		fmt.Fprintln(os.Stderr, "SECONDS must be a positive number")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], seconds); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
