// Compiled into every Go program that the tests build, beside its main.go
// (kiln_testkit::go_programs::build): burns measured in CPU time.
package main

import (
	"syscall"
	"time"
)

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
