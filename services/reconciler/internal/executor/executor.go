// Package executor runs the reconciler's operations: at most one operation
// per key (socket path) at a time, different keys in parallel, and
// exponential backoff per key after a failure, as the kubelet's goroutinemap
// does (500 ms doubling to 2m2s, shared by every operation on the key, reset
// by a success).
//
// Unlike the kubelet, the backoff belongs to a generation of the key: an
// operation for a new generation (a recreated socket) starts with no
// backoff. And a retry becomes due by itself: when a backoff ends, the
// executor calls the Due callback, so the caller does not need a tick.
package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/clock"
)

// Backoff parameters (the kubelet's).
const (
	InitialBackoff = 500 * time.Millisecond
	MaxBackoff     = 2*time.Minute + 2*time.Second
)

// ErrAlreadyRunning is returned by Run when an operation for the key is
// still executing.
var ErrAlreadyRunning = fmt.Errorf("an operation with that name is already executing: %w", errdefs.ErrAlreadyExists)

// ErrBackoff is returned by Run when the key's last operation failed and no
// retry is permitted yet.
var ErrBackoff = fmt.Errorf("no retries permitted yet: %w", errdefs.ErrFailedPrecondition)

// Attempt describes the operation being started.
type Attempt struct {
	// Failures is the number of consecutive failures of this key and
	// generation before this attempt.
	Failures int

	worker *worker // nil outside an executor (tests calling an Op)
}

// worker is an attempt's hold on one of the executor's MaxParallel slots.
type worker struct {
	sem  chan struct{}
	held bool // only the attempt's own goroutine reads or writes it
}

func (w *worker) take(ctx context.Context) error {
	select {
	case w.sem <- struct{}{}:
		w.held = true
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *worker) give() {
	if w.held {
		w.held = false
		<-w.sem
	}
}

// Waiting runs wait, which only waits (for a socket that refuses
// connections to listen, for a file to appear), with the attempt's worker
// given back meanwhile, so that a wait never holds a worker that other
// keys need (DESIGN "Dialling a new socket", "Stale sockets"). When wait
// succeeds, Waiting takes a worker again before it returns (or returns
// ctx's error when ctx ends first). When wait fails, the worker is not
// taken back: the operation should only record the failure and return.
// Call it only from the operation's own goroutine.
func (a Attempt) Waiting(ctx context.Context, wait func(context.Context) error) error {
	if a.worker == nil {
		return wait(ctx)
	}
	a.worker.give()
	if err := wait(ctx); err != nil {
		return err
	}
	return a.worker.take(ctx)
}

// Op is an operation. ctx ends when the executor's context ends.
type Op func(ctx context.Context, a Attempt) error

// State is a key's bookkeeping.
type State struct {
	Running    bool
	Generation string
	Failures   int
	LastError  error
	// RetryAt is when the next attempt is permitted (zero when none is
	// pending).
	RetryAt time.Time
}

// Options configure an Executor.
type Options struct {
	Clock clock.Clock
	Log   *slog.Logger
	// MaxParallel bounds the operations executing at once (0: 64), each
	// holding one worker except while it waits (Attempt.Waiting). Queued
	// operations count as running for their key.
	MaxParallel int
	// Due is called with the key (from its own goroutine) whenever an
	// operation ends and whenever a backoff ends, so the caller can start
	// the next one.
	Due func(key string)
}

// Executor runs operations. It is safe for concurrent use.
type Executor struct {
	clock clock.Clock
	log   *slog.Logger
	due   func(key string)
	sem   chan struct{}
	pool  *goPool

	mu   sync.Mutex
	keys map[string]*entry
	wg   sync.WaitGroup
}

type entry struct {
	State
	timer clock.Timer
	// cancel ends the running operation's context, for one started by
	// RunCancellable.
	cancel context.CancelCauseFunc
}

// New returns an executor.
func New(o Options) *Executor {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.MaxParallel <= 0 {
		o.MaxParallel = 64
	}
	if o.Due == nil {
		o.Due = func(string) {}
	}
	return &Executor{clock: o.Clock, log: o.Log, due: o.Due, sem: make(chan struct{}, o.MaxParallel), pool: newGoPool(), keys: map[string]*entry{}}
}

// Delay returns the backoff after failures consecutive failures.
func Delay(failures int) time.Duration {
	d := InitialBackoff
	for i := 1; i < failures; i++ {
		d *= 2
		if d >= MaxBackoff {
			return MaxBackoff
		}
	}
	return d
}

// Run starts op for key and generation on a goroutine of its own, unless an
// operation for key is running (ErrAlreadyRunning) or the key's generation
// is in backoff (ErrBackoff). A different generation than the one that
// failed starts afresh.
func (e *Executor) Run(ctx context.Context, key, generation string, op Op) error {
	return e.start(ctx, key, generation, op, false)
}

// RunCancellable is Run for an operation that Cancel may end: its context
// is cancelled, with Cancel's cause, when Cancel names its key and not its
// generation.
func (e *Executor) RunCancellable(ctx context.Context, key, generation string, op Op) error {
	return e.start(ctx, key, generation, op, true)
}

func (e *Executor) start(ctx context.Context, key, generation string, op Op, cancellable bool) error {
	e.mu.Lock()
	en, ok := e.keys[key]
	if !ok {
		en = &entry{}
		e.keys[key] = en
	}
	if en.Running {
		e.mu.Unlock()
		return ErrAlreadyRunning
	}
	if en.Generation != generation {
		// A new generation of the socket: forget the old one's backoff.
		if en.timer != nil {
			en.timer.Stop()
		}
		en.State = State{Generation: generation}
		en.timer = nil
	}
	if !en.RetryAt.IsZero() && e.clock.Now().Before(en.RetryAt) {
		e.mu.Unlock()
		return ErrBackoff
	}
	en.Running = true
	en.cancel = nil
	cancel := func(error) {}
	if cancellable {
		ctx, cancel = context.WithCancelCause(ctx)
		en.cancel = cancel
	}
	attempt := Attempt{Failures: en.Failures}
	e.wg.Add(1)
	e.mu.Unlock()

	e.pool.Go(func() {
		defer e.wg.Done()
		err := e.execute(ctx, key, op, attempt)
		cancel(nil)
		e.finish(key, generation, err)
		e.due(key)
	})
	return nil
}

// Cancel cancels, with cause, the running operation of key if it was
// started by RunCancellable for another generation than keep (any
// generation when keep is empty). It reports whether it cancelled one.
func (e *Executor) Cancel(key, keep string, cause error) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	en, ok := e.keys[key]
	if !ok || !en.Running || en.cancel == nil || (keep != "" && en.Generation == keep) {
		return false
	}
	en.cancel(cause)
	en.cancel = nil
	return true
}

func (e *Executor) execute(ctx context.Context, key string, op Op, a Attempt) (err error) {
	a.worker = &worker{sem: e.sem}
	if err := a.worker.take(ctx); err != nil {
		return err
	}
	defer a.worker.give()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("operation on %s panicked: %v: %w", key, p, errdefs.ErrInternal)
		}
	}()
	return op(ctx, a)
}

func (e *Executor) finish(key, generation string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	en := e.keys[key]
	en.Running = false
	en.cancel = nil
	if en.Generation != generation {
		return
	}
	if err == nil {
		delete(e.keys, key)
		return
	}
	en.Failures++
	en.LastError = err
	d := Delay(en.Failures)
	en.RetryAt = e.clock.Now().Add(d)
	if en.timer != nil {
		en.timer.Stop()
	}
	en.timer = e.clock.AfterFunc(d, func() { e.due(key) })
	e.log.Debug("operation failed; backing off", "key", key, "generation", generation, "failures", en.Failures, "retry_in", d, "error", err)
}

// RetryNow ends every key's backoff, keeping its failure count, so that
// its next operation may start at once (what it failed on came back). It
// returns the keys whose backoff ended.
func (e *Executor) RetryNow() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var keys []string
	for key, en := range e.keys {
		if en.Running || en.RetryAt.IsZero() {
			continue
		}
		if en.timer != nil {
			en.timer.Stop()
			en.timer = nil
		}
		en.RetryAt = time.Time{}
		keys = append(keys, key)
	}
	return keys
}

// State returns key's bookkeeping; ok is false when the key has neither a
// running operation nor a backoff.
func (e *Executor) State(key string) (State, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	en, ok := e.keys[key]
	if !ok {
		return State{}, false
	}
	return en.State, true
}

// Forget drops key's backoff unless an operation is running.
func (e *Executor) Forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	en, ok := e.keys[key]
	if !ok || en.Running {
		return
	}
	if en.timer != nil {
		en.timer.Stop()
	}
	delete(e.keys, key)
}

// Wait waits for every started operation to end; cancel their context
// first. It stops every backoff timer and the goroutines kept for
// operations.
func (e *Executor) Wait() {
	e.wg.Wait()
	e.mu.Lock()
	for _, en := range e.keys {
		if en.timer != nil {
			en.timer.Stop()
		}
	}
	e.mu.Unlock()
	e.pool.Stop()
}

// IsBackoff reports whether err is ErrBackoff or ErrAlreadyRunning, the
// errors that mean "not now" rather than failure.
func IsBackoff(err error) bool {
	return errors.Is(err, ErrBackoff) || errors.Is(err, ErrAlreadyRunning)
}
