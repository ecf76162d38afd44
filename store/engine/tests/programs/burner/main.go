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
	"syscall"
	"time"
)

var sink []byte
var kept [][]int

// deadline ends a burn after an amount of this process's CPU time, not of
// the wall clock: on a busy machine the program gets the CPU later but not
// less, so its profile holds as many samples as on an idle one. A minute of
// wall time bounds it all the same.
type deadline struct {
	cpu  time.Duration
	wall time.Time
}

// cpuNow is a deadline that has just passed; Add moves it later.
func cpuNow() deadline {
	return deadline{cpu: cpuTime(), wall: time.Now().Add(time.Minute)}
}

func (d deadline) Add(work time.Duration) deadline {
	return deadline{cpu: d.cpu + work, wall: d.wall}
}

func (d deadline) passed() bool {
	return cpuTime() >= d.cpu || time.Now().After(d.wall)
}

// cpuTime is the CPU time the process has used, in user and kernel mode.
func cpuTime() time.Duration {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		panic(err)
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}

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
