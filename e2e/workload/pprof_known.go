// The e2e suite's Go workload (check 8c, e2e/checks/8c_pprof.sh): Go's net/http/pprof on
// :6060, 1 MiB a second allocated in main.allocateKnown (the last 2 MiB of it kept in use),
// 25 goroutines parked in main.parked, a mutex main.contendKnown holds while another
// goroutine waits for it, a channel main.blockKnown waits on, and one line on stdout for
// every pprof request it serves, with its own counts at that moment, so the suite can hold
// what Kiln stored against what the program did:
//
//	scrape profile=allocs unix_ms=1765000000123 allocated=5242880 goroutines=31 contended_ns=2000123456 blocked_ns=4000123456 host=10.244.0.7:6060
//
// allocated is every byte allocateKnown allocated so far; goroutines is
// runtime.NumGoroutine() taken inside the handler serving that very request, so the
// goroutine serving it (and its connection's) count as they do in the profile it serves;
// host is the address the scraper asked for (the Host header).
//
// contended_ns and blocked_ns are the waits the mutex and block profiles record, measured by
// the program as those profiles measure them: from when the waiting goroutine starts to
// wait until the goroutine it waits for lets it go (the Unlock, the send), not until it runs
// again. Every event is recorded (runtime.SetMutexProfileFraction(1),
// runtime.SetBlockProfileRate(1)). The mutex profile puts a wait on the stack of the
// goroutine that unlocks, main.contendKnown; the block profile puts it on the stack that
// waited, main.blockKnown. Each wait ends before its counter is added to, so a scrape that
// falls between the two holds one wait more than the counter it logged (at most 20 ms of
// mutex wait, 50 ms of block).
//
// Go publishes an allocation to its memory profile only once a garbage collection cycle
// after it has ended (up to two cycles late), so before answering /allocs the program runs
// one, holding the allocator: the profile it serves then holds exactly the allocations its
// counter holds. runtime.MemProfileRate = 1 records every allocation; Go's default samples
// one per 512 KiB, about 120 samples in a minute of this rate: an estimate with a standard
// deviation near 9 %.
package main

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	blockBytes       = 64 << 10
	blocksPerSecond  = 16
	retainedBlocks   = 32
	parkedGoroutines = 25
	pprofPrefix      = "/debug/pprof/"
	// contendKnown holds its mutex this long each round, with the waiter waiting on it.
	holdTime = 20 * time.Millisecond
	// main.blockKnown waits this long for each value.
	feedInterval = 50 * time.Millisecond
)

var (
	// mu holds the allocator while a scrape reads its counter and collects garbage.
	mu        sync.Mutex
	allocated uint64
	retained  [retainedBlocks][]byte
	next      int

	// contended is the mutex main.contendKnown holds while waitContended waits for it.
	contended sync.Mutex
	// releasedNs is when contendKnown last called Unlock (unix ns).
	releasedNs atomic.Int64
	// contendedNs and blockedNs: the waits the mutex and block profiles record, summed.
	contendedNs atomic.Int64
	blockedNs   atomic.Int64
)

func init() {
	runtime.MemProfileRate = 1
	runtime.SetMutexProfileFraction(1)
	runtime.SetBlockProfileRate(1)
}

// allocateKnown allocates one block, keeping the last retainedBlocks of them in use.
//
//go:noinline
func allocateKnown() {
	mu.Lock()
	defer mu.Unlock()
	retained[next%retainedBlocks] = make([]byte, blockBytes)
	next++
	allocated += blockBytes
}

// parked waits for a value that never comes.
//
//go:noinline
func parked(never <-chan struct{}) {
	<-never
}

// contendKnown takes the mutex, lets the waiter start waiting on it, holds it for holdTime
// and unlocks it: each round's wait is on contendKnown's stack in the mutex profile.
//
//go:noinline
func contendKnown(held chan<- struct{}, done <-chan struct{}) {
	for {
		contended.Lock()
		held <- struct{}{}
		time.Sleep(holdTime)
		releasedNs.Store(time.Now().UnixNano())
		contended.Unlock()
		<-done
	}
}

// waitContended waits for the mutex each time contendKnown holds it, and adds up each wait
// from its start to contendKnown's Unlock.
//
//go:noinline
func waitContended(held <-chan struct{}, done chan<- struct{}) {
	for {
		<-held
		started := time.Now().UnixNano()
		contended.Lock()
		// Not positive: the Unlock came first and nothing waited (nor was recorded).
		if waited := releasedNs.Load() - started; waited > 0 {
			contendedNs.Add(waited)
		}
		contended.Unlock()
		done <- struct{}{}
	}
}

// blockKnown waits on values fed every feedInterval, each stamped when it was sent, and adds
// up each wait from its start to the send.
//
//go:noinline
func blockKnown(fed <-chan int64) {
	for {
		started := time.Now().UnixNano()
		sent := <-fed
		// Not positive: the value was there first (its sender waited, not blockKnown).
		if waited := sent - started; waited > 0 {
			blockedNs.Add(waited)
		}
	}
}

// logged serves net/http/pprof's profiles, printing the program's counts for each request.
func logged(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, pprofPrefix)
	mu.Lock()
	count := allocated
	if name == "allocs" {
		runtime.GC()
	}
	mu.Unlock()
	contendedSoFar, blockedSoFar := contendedNs.Load(), blockedNs.Load()
	fmt.Printf("scrape profile=%s unix_ms=%d allocated=%d goroutines=%d contended_ns=%d blocked_ns=%d host=%s\n",
		name, time.Now().UnixMilli(), count, runtime.NumGoroutine(), contendedSoFar, blockedSoFar, r.Host)
	pprof.Index(w, r)
}

func main() {
	never := make(chan struct{})
	for i := 0; i < parkedGoroutines; i++ {
		go parked(never)
	}
	go func() {
		tick := time.NewTicker(time.Second / blocksPerSecond)
		for range tick.C {
			allocateKnown()
		}
	}()
	held, done := make(chan struct{}), make(chan struct{})
	go contendKnown(held, done)
	go waitContended(held, done)
	fed := make(chan int64)
	go blockKnown(fed)
	go func() {
		tick := time.NewTicker(feedInterval)
		for range tick.C {
			fed <- time.Now().UnixNano()
		}
	}()
	fmt.Printf("started block_bytes=%d blocks_per_second=%d retained_blocks=%d parked=%d hold_ms=%d feed_ms=%d\n",
		blockBytes, blocksPerSecond, retainedBlocks, parkedGoroutines,
		holdTime.Milliseconds(), feedInterval.Milliseconds())
	mux := http.NewServeMux()
	mux.HandleFunc(pprofPrefix, logged)
	server := &http.Server{Addr: ":6060", Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := server.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
