// Writes a real Go CPU profile and heap profile with runtime/pprof, so the
// engine's round-trip tests have real runtime output without ../shared.
//
// Usage: burner <cpu.pprof> <heap.pprof>
package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"time"
)

var sink []byte
var kept [][]int

// burnHash hashes in a loop: one recognisable CPU-bound frame.
func burnHash(until deadline) {
	sum := sha256.Sum256([]byte("kiln"))
	for !until.passed() {
		for i := 0; i < 1000; i++ {
			sum = sha256.Sum256(sum[:])
		}
	}
	sink = sum[:]
}

// burnSort sorts fresh slices: a second CPU frame that also allocates.
func burnSort(until deadline) {
	for !until.passed() {
		values := make([]int, 4096)
		for i := range values {
			values[i] = (i * 7919) % 4099
		}
		sort.Ints(values)
		if len(kept) < 64 {
			kept = append(kept, values)
		}
	}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: burner <cpu.pprof> <heap.pprof>")
		os.Exit(2)
	}
	runtime.MemProfileRate = 4096
	cpu, err := os.Create(os.Args[1])
	if err != nil {
		panic(err)
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		panic(err)
	}
	until := cpuNow().Add(700 * time.Millisecond)
	burnHash(until)
	burnSort(until.Add(700 * time.Millisecond))
	pprof.StopCPUProfile()
	if err := cpu.Close(); err != nil {
		panic(err)
	}
	heap, err := os.Create(os.Args[2])
	if err != nil {
		panic(err)
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(heap); err != nil {
		panic(err)
	}
	if err := heap.Close(); err != nil {
		panic(err)
	}
}
