package executor

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// goid is the calling goroutine's ID, from its stack's header line.
func goid() uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	buf = bytes.TrimPrefix(buf, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(buf[:bytes.IndexByte(buf, ' ')]), 10, 64)
	return id
}

// A goroutine of the pool that finished one function runs the next one,
// and Stop ends the idle goroutines; after Stop, functions still run.
func TestPoolReusesIdleGoroutines(t *testing.T) {
	p := newGoPool()
	ids := make(chan uint64, 2)
	first := make(chan struct{})
	p.Go(func() { ids <- goid(); close(first) })
	<-first
	// The goroutine that ran the first function is idle (or about to be):
	// hand it the second one as soon as it receives.
	var done sync.WaitGroup
	done.Add(1)
	second := func() { ids <- goid(); done.Done() }
	testutil.WaitFor(t, "the first function's goroutine to take another", func() bool {
		select {
		case p.work <- second:
			return true
		default:
			return false
		}
	})
	done.Wait()
	if a, b := <-ids, <-ids; a != b {
		t.Errorf("the second function ran on goroutine %d, not on the idle one (%d)", b, a)
	}
	p.Stop()
	ran := make(chan struct{})
	p.Go(func() { close(ran) })
	<-ran
}
