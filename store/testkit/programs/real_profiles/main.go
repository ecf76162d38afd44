// Writes real profiles of its own work with runtime/pprof, for the tests
// that need real inputs without ../shared (kiln-testkit's real_inputs):
//
//	cpu.pprof        CPU, labelled work (pprof.Do), an inlined helper, and a
//	                 label value that is not valid UTF-8
//	heap.pprof       4 sample types, thousands of distinct allocation stacks
//	                 (MemProfileRate=1) and stacks deeper than Go records
//	block.pprof      contentions and delay of a contended mutex
//	mutex.pprof      the same contention, from the holder's side
//	goroutine.pprof  the live goroutines
//	goroutine.txt    the legacy text format (debug=1), which is not protobuf
//	block.txt        the same, for the block profile
//
// Usage: real_profiles OUT_DIR
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"
)

var sink [][]byte

// descend allocates at the end of a path of branchA/branchB calls chosen by
// the bits of path, so each path is its own allocation stack.
func descend(depth, path int) {
	if depth == 0 {
		sink = append(sink, make([]byte, 64+path%512))
		return
	}
	if path&1 == 0 {
		branchA(depth, path)
	} else {
		branchB(depth, path)
	}
}

//go:noinline
func branchA(depth, path int) { descend(depth-1, path>>1) }

//go:noinline
func branchB(depth, path int) { descend(depth-1, path>>1) }

// deepRecursion allocates below n frames of itself: deeper than the
// runtime records, so its stacks are truncated.
//
//go:noinline
func deepRecursion(n int) {
	if n == 0 {
		sink = append(sink, make([]byte, 1024))
		return
	}
	deepRecursion(n - 1)
}

// square is small enough to be inlined into spinHash, so spinHash's
// locations carry two lines.
func square(x uint64) uint64 { return x*x + 1 }

//go:noinline
func spinHash(d time.Duration) uint64 {
	var acc uint64
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := uint64(0); i < 10000; i++ {
			acc = square(acc + i)
		}
	}
	return acc
}

//go:noinline
func contend(mu *sync.Mutex, rounds int) uint64 {
	var acc uint64
	for i := 0; i < rounds; i++ {
		mu.Lock()
		acc += spinHash(0)
		mu.Unlock()
	}
	return acc
}

func write(dir, name string, profile *pprof.Profile, debug int) error {
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	if err := profile.WriteTo(f, debug); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func run(dir string) error {
	runtime.MemProfileRate = 1
	runtime.SetBlockProfileRate(1)
	runtime.SetMutexProfileFraction(1)

	cpu, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		return err
	}
	labels := pprof.Labels("phase", "hash", "raw", "bad\xff\xfeutf8")
	pprof.Do(context.Background(), labels, func(context.Context) {
		spinHash(400 * time.Millisecond)
	})
	for path := 0; path < 4096; path++ {
		descend(12, path)
	}
	deepRecursion(300)
	// The contention is made certain, not left to the scheduler: on a busy machine the
	// four goroutines could otherwise each run their rounds alone and never wait. The
	// lock is held until every goroutine has started and had time to park in contend's
	// Lock; from then on, each unlock in contend has waiters behind it.
	var mu sync.Mutex
	var wg, started sync.WaitGroup
	mu.Lock()
	for i := 0; i < 4; i++ {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			started.Done()
			contend(&mu, 2000)
		}()
	}
	started.Wait()
	time.Sleep(50 * time.Millisecond)
	mu.Unlock()
	wg.Wait()
	pprof.StopCPUProfile()
	if err := cpu.Close(); err != nil {
		return err
	}

	// The heap profile shows allocations as of the last collection.
	runtime.GC()
	for _, p := range []struct {
		profile, file string
		debug         int
	}{
		{"heap", "heap.pprof", 0},
		{"block", "block.pprof", 0},
		{"mutex", "mutex.pprof", 0},
		{"goroutine", "goroutine.pprof", 0},
		{"goroutine", "goroutine.txt", 1},
		{"block", "block.txt", 1},
	} {
		if err := write(dir, p.file, pprof.Lookup(p.profile), p.debug); err != nil {
			return fmt.Errorf("%s: %w", p.file, err)
		}
	}
	runtime.KeepAlive(sink)
	return nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: real_profiles OUT_DIR")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
