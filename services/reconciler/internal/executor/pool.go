package executor

import (
	"sync"
	"time"
)

// poolIdle is how long a pool goroutine waits for another operation
// before it ends.
const poolIdle = 10 * time.Second

// goPool runs functions on goroutines it keeps between them for a while.
// An operation's goroutine grows its stack through gRPC's client path
// (dial, GetInfo, the handler's call, Notify); a fresh goroutine per
// operation grew it again every time, a tenth of the reconciler's CPU in
// a burst of 1,000 registrations.
type goPool struct {
	work chan func() // unbuffered: a send succeeds only into an idle goroutine
	quit chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	stopped bool
}

func newGoPool() *goPool {
	return &goPool{work: make(chan func()), quit: make(chan struct{})}
}

// Go runs f on an idle goroutine of the pool, else on a new one that
// joins the pool when f returns. After Stop, f runs on a goroutine of its
// own.
func (p *goPool) Go(f func()) {
	select {
	case p.work <- f:
		return
	default:
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		go f()
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go p.run(f)
}

func (p *goPool) run(f func()) {
	defer p.wg.Done()
	idle := time.NewTimer(poolIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(poolIdle)
		select {
		case f = <-p.work:
		case <-idle.C:
			return
		case <-p.quit:
			return
		}
	}
}

// Stop ends the idle goroutines and waits for the busy ones to finish.
func (p *goPool) Stop() {
	p.mu.Lock()
	if !p.stopped {
		p.stopped = true
		close(p.quit)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
