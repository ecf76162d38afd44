// The e2e suite's Go workload (check 8c, e2e/checks/8c_pprof.sh): Go's net/http/pprof on
// :6060, 1 MiB a second allocated in main.allocateKnown (the last 2 MiB of it kept in use),
// 25 goroutines parked in main.parked, and one line on stdout for every pprof request it
// serves, with its own counts at that moment, so the suite can hold what Kiln stored against
// what the program did:
//
//	scrape profile=allocs unix_ms=1765000000123 allocated=5242880 goroutines=29 host=10.244.0.7:6060
//
// allocated is every byte allocateKnown allocated so far; goroutines is
// runtime.NumGoroutine() taken inside the handler serving that very request, so the
// goroutine serving it (and its connection's) count as they do in the profile it serves;
// host is the address the scraper asked for (the Host header).
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
	"time"
)

const (
	blockBytes       = 64 << 10
	blocksPerSecond  = 16
	retainedBlocks   = 32
	parkedGoroutines = 25
	pprofPrefix      = "/debug/pprof/"
)

var (
	// mu holds the allocator while a scrape reads its counter and collects garbage.
	mu        sync.Mutex
	allocated uint64
	retained  [retainedBlocks][]byte
	next      int
)

func init() {
	runtime.MemProfileRate = 1
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

// logged serves net/http/pprof's profiles, printing the program's counts for each request.
func logged(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, pprofPrefix)
	mu.Lock()
	count := allocated
	if name == "allocs" {
		runtime.GC()
	}
	mu.Unlock()
	fmt.Printf("scrape profile=%s unix_ms=%d allocated=%d goroutines=%d host=%s\n",
		name, time.Now().UnixMilli(), count, runtime.NumGoroutine(), r.Host)
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
	fmt.Printf("started block_bytes=%d blocks_per_second=%d retained_blocks=%d parked=%d\n",
		blockBytes, blocksPerSecond, retainedBlocks, parkedGoroutines)
	mux := http.NewServeMux()
	mux.HandleFunc(pprofPrefix, logged)
	server := &http.Server{Addr: ":6060", Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := server.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
