// Writes a real CPU profile with runtime/pprof for one of several small
// "services", so the UI and CLI tests can seed a store with distinct real
// processes without ../shared. Every service hashes from two distinct
// callers (its own handler and auditLog), which the sandwich view must show.
//
// Usage: workload <checkout|search|ingest> <cpu.pprof>
package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"runtime/pprof"
	"sort"
	"time"
)

var sink []byte

// hashItems is the shared hot function.
//
//go:noinline
func hashItems(rounds int) {
	sum := sha256.Sum256([]byte("kiln"))
	for i := 0; i < rounds; i++ {
		sum = sha256.Sum256(sum[:])
	}
	sink = sum[:]
}

//go:noinline
func auditLog(until deadline) {
	for !until.passed() {
		hashItems(2000)
	}
}

//go:noinline
func handleCheckout(until deadline) {
	for !until.passed() {
		hashItems(2000)
	}
}

//go:noinline
func handleSearch(until deadline) {
	for !until.passed() {
		hashItems(500)
		values := make([]int, 2048)
		for i := range values {
			values[i] = (i * 7919) % 2053
		}
		sort.Ints(values)
	}
}

//go:noinline
func handleIngest(until deadline) {
	buffer := make([]byte, 1<<16)
	for !until.passed() {
		for i := range buffer {
			buffer[i] = byte(i * 31)
		}
		hashItems(200)
	}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: workload <checkout|search|ingest> <cpu.pprof>")
		os.Exit(2)
	}
	handlers := map[string]func(deadline){
		"checkout": handleCheckout,
		"search":   handleSearch,
		"ingest":   handleIngest,
	}
	handler, ok := handlers[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown service %q\n", os.Args[1])
		os.Exit(2)
	}
	out, err := os.Create(os.Args[2])
	if err != nil {
		panic(err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		panic(err)
	}
	start := cpuNow()
	handler(start.Add(800 * time.Millisecond))
	auditLog(start.Add(1200 * time.Millisecond))
	pprof.StopCPUProfile()
	if err := out.Close(); err != nil {
		panic(err)
	}
}
