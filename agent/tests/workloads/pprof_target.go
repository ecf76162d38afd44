// A Go service with net/http/pprof and known totals, for the agent's
// scrape test: it allocates exactly `count` blocks of 64 KiB in
// main.allocateKnown (a size class of its own, so the runtime records the
// size asked for), keeps the last 16 live (the heap names that function),
// and parks `parked` goroutines in main.parked.
//
// Allocation starts only after the first /debug/pprof/allocs answer has
// been written, so that scrape is the agent's baseline and every block is
// counted in the deltas after it. The program prints
// `listening <addr>`, then `goroutines <n>` once all are parked, then
// `done allocated=<bytes>` once every block was allocated and three GCs
// published the profile.
package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"
)

const blockBytes = 64 << 10

var live [16][]byte

//go:noinline
func allocateKnown() []byte {
	return make([]byte, blockBytes)
}

//go:noinline
func parked(wait <-chan struct{}, ready *sync.WaitGroup) {
	ready.Done()
	<-wait
}

func main() {
	// Every allocation recorded, so the profile's totals are exact.
	runtime.MemProfileRate = 1
	runtime.SetMutexProfileFraction(1)
	runtime.SetBlockProfileRate(1)
	count, _ := strconv.Atoi(os.Args[1])
	parkedCount, _ := strconv.Atoi(os.Args[2])

	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	baseline := make(chan struct{})
	var once sync.Once
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/allocs", func(w http.ResponseWriter, r *http.Request) {
		pprof.Handler("allocs").ServeHTTP(w, r)
		once.Do(func() { close(baseline) })
	})
	go func() { _ = http.Serve(listener, mux) }()
	fmt.Printf("listening %s\n", listener.Addr())

	wait := make(chan struct{})
	var ready sync.WaitGroup
	ready.Add(parkedCount)
	for i := 0; i < parkedCount; i++ {
		go parked(wait, &ready)
	}
	ready.Wait()
	fmt.Printf("goroutines %d\n", runtime.NumGoroutine())

	<-baseline
	for i := 0; i < count; i++ {
		live[i%len(live)] = allocateKnown()
		time.Sleep(5 * time.Millisecond)
	}
	// The heap profile is published at the end of a GC cycle and lags up
	// to two: three cycles publish every allocation above.
	for i := 0; i < 3; i++ {
		runtime.GC()
	}
	fmt.Printf("done allocated=%d\n", count*blockBytes)
	select {}
}
