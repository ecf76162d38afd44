// Writes real profiles with runtime/pprof (CPU with a pprof label, heap,
// goroutine), so kiln-pprof's real-runtime tests need nothing from ../shared.
//
// Usage: profiled <out-dir>
package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"time"
)

var sink []byte
var kept [][]int

// spinHash hashes in a loop: a CPU-bound frame the test looks for.
func spinHash(until deadline) {
	sum := sha256.Sum256([]byte("kiln-pprof"))
	for !until.passed() {
		for i := 0; i < 1000; i++ {
			sum = sha256.Sum256(sum[:])
		}
	}
	sink = sum[:]
}

// sortFresh sorts new slices and keeps some: CPU and heap in one frame.
func sortFresh(until deadline) {
	for !until.passed() {
		values := make([]int, 2048)
		for i := range values {
			values[i] = (i * 7919) % 2053
		}
		sort.Ints(values)
		if len(kept) < 128 {
			kept = append(kept, values)
		}
	}
}

func write(dir, name string, profile func(*os.File) error) {
	file, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		panic(err)
	}
	if err := profile(file); err != nil {
		panic(err)
	}
	if err := file.Close(); err != nil {
		panic(err)
	}
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: profiled <out-dir>")
		os.Exit(2)
	}
	dir := os.Args[1]
	runtime.MemProfileRate = 4096
	write(dir, "cpu.pprof", func(file *os.File) error {
		if err := pprof.StartCPUProfile(file); err != nil {
			return err
		}
		// The label is carried on each sample of the labelled work.
		pprof.Do(context.Background(), pprof.Labels("phase", "hash"), func(context.Context) {
			spinHash(cpuNow().Add(600 * time.Millisecond))
		})
		sortFresh(cpuNow().Add(600 * time.Millisecond))
		pprof.StopCPUProfile()
		return nil
	})
	runtime.GC()
	write(dir, "heap.pprof", func(file *os.File) error { return pprof.WriteHeapProfile(file) })
	write(dir, "goroutine.pprof", func(file *os.File) error {
		return pprof.Lookup("goroutine").WriteTo(file, 0)
	})
}
