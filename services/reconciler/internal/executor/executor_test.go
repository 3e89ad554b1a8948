package executor

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nodeplug/nodeplug/services/reconciler/internal/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDelay(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{
		{1, 500 * time.Millisecond},
		{2, time.Second},
		{3, 2 * time.Second},
		{8, 64 * time.Second},
		{9, MaxBackoff}, // 128 s is past the cap
		{50, MaxBackoff},
	} {
		if got := Delay(tc.failures); got != tc.want {
			t.Errorf("Delay(%d) = %v, want %v", tc.failures, got, tc.want)
		}
	}
}

// harness runs ops and reports their ends and Due calls on channels.
type harness struct {
	t   *testing.T
	clk *clock.Fake
	e   *Executor
	due chan struct{}
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, clk: clock.NewFake(time.Unix(0, 0)), due: make(chan struct{}, 100)}
	h.e = New(Options{Clock: h.clk, Due: func(string) { h.due <- struct{}{} }})
	t.Cleanup(h.e.Wait)
	return h
}

func (h *harness) waitDue() {
	h.t.Helper()
	select {
	case <-h.due:
	case <-time.After(30 * time.Second):
		h.t.Fatal("Due was not called")
	}
}

// runAndWait runs an op returning err and waits for it to end.
func (h *harness) runAndWait(key, gen string, err error) Attempt {
	h.t.Helper()
	got := make(chan Attempt, 1)
	if e := h.e.Run(context.Background(), key, gen, func(_ context.Context, a Attempt) error { got <- a; return err }); e != nil {
		h.t.Fatalf("Run(%s, %s) = %v", key, gen, e)
	}
	a := <-got
	h.waitDue()
	return a
}

func TestBackoffByOrderAndState(t *testing.T) {
	h := newHarness(t)
	boom := errors.New("boom")
	if a := h.runAndWait("s", "g1", boom); a.Failures != 0 {
		t.Fatalf("first attempt failures = %d", a.Failures)
	}
	st, _ := h.e.State("s")
	if st.Failures != 1 || !st.RetryAt.Equal(h.clk.Now().Add(500*time.Millisecond)) || !errors.Is(st.LastError, boom) {
		t.Fatalf("state after one failure = %+v", st)
	}
	if err := h.e.Run(context.Background(), "s", "g1", func(context.Context, Attempt) error { return nil }); !errors.Is(err, ErrBackoff) {
		t.Fatalf("Run during backoff = %v, want ErrBackoff", err)
	}
	// The backoff ends by itself: the timer calls Due.
	h.clk.Advance(500 * time.Millisecond)
	h.waitDue()
	if a := h.runAndWait("s", "g1", boom); a.Failures != 1 {
		t.Fatalf("second attempt failures = %d", a.Failures)
	}
	st, _ = h.e.State("s")
	if st.Failures != 2 || !st.RetryAt.Equal(h.clk.Now().Add(time.Second)) {
		t.Fatalf("state after two failures = %+v", st)
	}
	// Another key is not affected.
	h.runAndWait("other", "g1", nil)
	// A new generation starts afresh, without waiting.
	if a := h.runAndWait("s", "g2", boom); a.Failures != 0 {
		t.Fatalf("new generation attempt failures = %d, want 0", a.Failures)
	}
	st, _ = h.e.State("s")
	if st.Failures != 1 || st.Generation != "g2" {
		t.Fatalf("state after new generation failed = %+v", st)
	}
	h.clk.Advance(500 * time.Millisecond)
	h.waitDue()
	// Success clears the key.
	h.runAndWait("s", "g2", nil)
	if _, ok := h.e.State("s"); ok {
		t.Fatal("state kept after success")
	}
}

func TestOneOperationPerKey(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	started := make(chan struct{})
	if err := h.e.Run(context.Background(), "s", "g", func(context.Context, Attempt) error { close(started); <-release; return nil }); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := h.e.Run(context.Background(), "s", "g2", func(context.Context, Attempt) error { return nil }); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second Run = %v, want ErrAlreadyRunning", err)
	}
	// Other keys run in parallel.
	h.runAndWait("t", "g", nil)
	close(release)
	h.waitDue()
	h.runAndWait("s", "g", nil)
}

func TestPanicIsAFailure(t *testing.T) {
	h := newHarness(t)
	if err := h.e.Run(context.Background(), "s", "g", func(context.Context, Attempt) error { panic("bad plugin") }); err != nil {
		t.Fatal(err)
	}
	h.waitDue()
	if st, ok := h.e.State("s"); !ok || st.Failures != 1 {
		t.Fatalf("state after panic = %+v, %v", st, ok)
	}
}

// With one worker, an operation that waits (Attempt.Waiting) lets another
// key's operation run meanwhile; one that does not wait holds the worker,
// and the other key's operation starts only after it. The order of events
// is the proof, not time.
func TestWaitingGivesTheWorkerBack(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	ended := make(chan string, 10)
	e := New(Options{Clock: clk, MaxParallel: 1, Due: func(string) {}})
	t.Cleanup(e.Wait)
	ctx := context.Background()

	events := make(chan string, 10)
	waiting, release, resumed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	if err := e.Run(ctx, "stale", "g", func(ctx context.Context, a Attempt) error {
		err := a.Waiting(ctx, func(context.Context) error { close(waiting); <-release; return nil })
		events <- "stale resumed"
		close(resumed)
		<-release
		ended <- "stale"
		return err
	}); err != nil {
		t.Fatal(err)
	}
	<-waiting
	if err := e.Run(ctx, "healthy", "g", func(context.Context, Attempt) error { events <- "healthy ran"; ended <- "healthy"; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := <-events; got != "healthy ran" {
		t.Fatalf("first event = %q: the waiting operation kept the only worker", got)
	}
	<-ended
	close(release)
	<-resumed
	// Now "stale" holds the worker again: a third operation waits for it.
	if err := e.Run(ctx, "third", "g", func(context.Context, Attempt) error { events <- "third ran"; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := <-events; got != "stale resumed" {
		t.Fatalf("event = %q, want the stale operation resumed", got)
	}
	if got := <-ended; got != "stale" {
		t.Fatalf("ended = %q", got)
	}
	if got := <-events; got != "third ran" {
		t.Fatalf("event = %q", got)
	}
}

// A wait that fails does not take a worker back: the operation only records
// its failure, and the worker is free for others at once.
func TestFailedWaitTakesNoWorker(t *testing.T) {
	e := New(Options{Clock: clock.NewFake(time.Unix(0, 0)), MaxParallel: 1})
	t.Cleanup(e.Wait)
	ctx := context.Background()
	refused := errors.New("refused")
	failed, release := make(chan struct{}), make(chan struct{})
	if err := e.Run(ctx, "stale", "g", func(ctx context.Context, a Attempt) error {
		err := a.Waiting(ctx, func(context.Context) error { return refused })
		close(failed)
		<-release
		return err
	}); err != nil {
		t.Fatal(err)
	}
	<-failed
	ran := make(chan struct{})
	if err := e.Run(ctx, "healthy", "g", func(context.Context, Attempt) error { close(ran); return nil }); err != nil {
		t.Fatal(err)
	}
	<-ran
	close(release)
}

// Cancel ends a RunCancellable operation of another generation than the one
// kept, with its cause; it leaves alone the kept generation and operations
// started by Run.
func TestCancel(t *testing.T) {
	e := New(Options{Clock: clock.NewFake(time.Unix(0, 0))})
	t.Cleanup(e.Wait)
	ctx := context.Background()
	gone := errors.New("socket gone")
	causes := make(chan error, 3)
	started := make(chan struct{}, 3)
	wait := func(ctx context.Context, _ Attempt) error {
		started <- struct{}{}
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := e.Run(stop, "plain", "g1", wait); err != nil {
		t.Fatal(err)
	}
	if err := e.RunCancellable(ctx, "c", "g1", wait); err != nil {
		t.Fatal(err)
	}
	<-started
	<-started
	if e.Cancel("plain", "g2", gone) {
		t.Fatal("Cancel ended an operation started by Run")
	}
	if e.Cancel("c", "g1", gone) {
		t.Fatal("Cancel ended the kept generation's operation")
	}
	if !e.Cancel("c", "g2", gone) {
		t.Fatal("Cancel did not end the operation of another generation")
	}
	if got := <-causes; !errors.Is(got, gone) {
		t.Fatalf("cause = %v, want %v", got, gone)
	}
	cancel()
	if got := <-causes; !errors.Is(got, context.Canceled) {
		t.Fatalf("plain operation's cause = %v", got)
	}
}

// RetryNow ends a backoff at once and keeps the failure count.
func TestRetryNow(t *testing.T) {
	h := newHarness(t)
	boom := errors.New("boom")
	h.runAndWait("s", "g", boom)
	if err := h.e.Run(context.Background(), "s", "g", func(context.Context, Attempt) error { return nil }); !errors.Is(err, ErrBackoff) {
		t.Fatalf("Run during backoff = %v", err)
	}
	if keys := h.e.RetryNow(); len(keys) != 1 || keys[0] != "s" {
		t.Fatalf("RetryNow = %v", keys)
	}
	if a := h.runAndWait("s", "g", boom); a.Failures != 1 {
		t.Fatalf("failures after RetryNow = %d, want 1", a.Failures)
	}
}
