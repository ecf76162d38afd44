// Writes a real CPU profile with runtime/pprof for one of two pods whose
// stacks the UI flow test (tests/browser/ui_flow.mjs) knows, so that the
// flow runs without ../shared:
//
//	checkout: main.busyLoop, on every stack of the main goroutine, calls
//	          main.hashRound (most of the time, the largest flat function)
//	          and main.shuffle (the frame the flow zooms into).
//	search:   main.searchLoop calls main.scanIndex; no checkout function.
//
// The collector is off, so the main goroutine has the samples to itself.
//
// Usage: pods <checkout|search> <cpu.pprof>
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"time"
)

var sink uint64

//go:noinline
func hashRound(x uint64) uint64 {
	for i := 0; i < 4000; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

//go:noinline
func shuffle(values []uint64, seed uint64) {
	for i := len(values) - 1; i > 0; i-- {
		seed = seed*6364136223846793005 + 1442695040888963407
		j := int(seed % uint64(i+1))
		values[i], values[j] = values[j], values[i]
	}
}

//go:noinline
func busyLoop(until time.Time) {
	values := make([]uint64, 256)
	for i := range values {
		values[i] = uint64(i)
	}
	for time.Now().Before(until) {
		sink = hashRound(sink + 1)
		shuffle(values, sink)
	}
}

//go:noinline
func scanIndex(index []uint64, key uint64) int {
	hits := 0
	for _, v := range index {
		if v%1024 == key%1024 {
			hits++
		}
	}
	return hits
}

//go:noinline
func searchLoop(until time.Time) {
	index := make([]uint64, 1<<14)
	for i := range index {
		index[i] = uint64(i) * 2654435761
	}
	for key := uint64(0); time.Now().Before(until); key++ {
		sink += uint64(scanIndex(index, key))
	}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: pods <checkout|search> <cpu.pprof>")
		os.Exit(2)
	}
	loops := map[string]func(time.Time){"checkout": busyLoop, "search": searchLoop}
	loop, ok := loops[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown pod %q\n", os.Args[1])
		os.Exit(2)
	}
	debug.SetGCPercent(-1)
	out, err := os.Create(os.Args[2])
	if err == nil {
		err = pprof.StartCPUProfile(out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	loop(time.Now().Add(1500 * time.Millisecond))
	pprof.StopCPUProfile()
	if err := out.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
