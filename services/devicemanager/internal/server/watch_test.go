package server

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
)

// follower reads a WatchResources stream to its end and hands on every
// change of resource after the synced marker.
type follower struct {
	changes chan *dmv1.Resource
	done    chan struct{}
	err     error // why the stream ended; valid after done
}

func follow(t *testing.T, ws grpc.ServerStreamingClient[dmv1.WatchResourcesResponse], resource string) *follower {
	t.Helper()
	f := &follower{changes: make(chan *dmv1.Resource, 4096), done: make(chan struct{})}
	synced := make(chan struct{})
	go func() {
		defer close(f.done)
		isSynced := false
		for {
			msg, err := ws.Recv()
			if err != nil {
				f.err = err
				if !isSynced {
					close(synced)
				}
				return
			}
			if msg.GetSynced() != nil {
				isSynced = true
				close(synced)
			} else if c := msg.GetChange(); isSynced && c.GetResource().GetName() == resource {
				f.changes <- c.GetResource()
			}
		}
	}()
	select {
	case <-synced:
	case <-time.After(testutil.Deadline):
		t.Fatal("no synced marker")
	}
	select {
	case <-f.done:
		t.Fatalf("the stream ended before its synced marker: %v", f.err)
	default:
	}
	return f
}

// next waits for the follower's next change.
func (f *follower) next(t *testing.T) *dmv1.Resource {
	t.Helper()
	select {
	case r := <-f.changes:
		return r
	case <-f.done:
		t.Fatalf("the stream ended: %v", f.err)
	case <-time.After(testutil.Deadline):
		t.Fatal("no change")
	}
	return nil
}

// flip turns dev-0 of p unhealthy or healthy and waits until every
// follower saw the resource with that many allocatable devices.
func flip(t *testing.T, p *sampleplugin.Plugin, healthy bool, total int64, fs ...*follower) {
	t.Helper()
	if err := p.SetHealth("dev-0", healthy); err != nil {
		t.Fatal(err)
	}
	want := total - 1
	if healthy {
		want = total
	}
	for _, f := range fs {
		for r := f.next(t); r.GetAllocatable() != want; r = f.next(t) {
		}
	}
}

// TestWatchStreamsBoundedInCount: past the limit of open streams a new
// WatchResources gets RESOURCE_EXHAUSTED; the open ones keep working, and
// a stream that ends makes room for another.
func TestWatchStreamsBoundedInCount(t *testing.T) {
	const limit = 3
	e := newEnvWatch(t, time.Minute, stream.Limits{Subscribers: limit})
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/w", Devices: 2}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/w", 2, 2)

	var open []*follower
	var cancels []context.CancelFunc
	for range limit {
		ctx, cancel := contextWithCancel(t)
		ws, err := e.client.WatchResources(ctx, &dmv1.WatchResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, follow(t, ws, "example.com/w"))
		cancels = append(cancels, cancel)
	}
	for i := range 2 {
		ws, err := e.client.WatchResources(ctxT(t), &dmv1.WatchResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ws.Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "no room for another subscriber") {
			t.Fatalf("stream %d past the limit: %v; want RESOURCE_EXHAUSTED", limit+i+1, err)
		}
	}
	flip(t, p, false, 2, open...)
	flip(t, p, true, 2, open...)

	cancels[0]()
	<-open[0].done
	testutil.WaitFor(t, "the cancelled stream gone", func() bool { return e.m.WatchStats().Subscribers == limit-1 })
	ctx, cancel := contextWithCancel(t)
	defer cancel()
	ws, err := e.client.WatchResources(ctx, &dmv1.WatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	open[0] = follow(t, ws, "example.com/w")
	flip(t, p, false, 2, open...)
	for _, c := range cancels {
		c()
	}
}

// TestWatchStreamsDefaultCount: of 80 streams opened at once, exactly
// stream.DefaultSubscribers are served; the rest get RESOURCE_EXHAUSTED at once
// (500 such streams that never read took the devicemanager from 27 MB to
// 214 MB before the bound).
func TestWatchStreamsDefaultCount(t *testing.T) {
	e := newEnv(t, time.Minute)
	ctx, cancel := contextWithCancel(t)
	defer cancel()
	const n = stream.DefaultSubscribers + 16
	var served, refused int
	var streams []grpc.ServerStreamingClient[dmv1.WatchResourcesResponse]
	for range n {
		ws, err := e.client.WatchResources(ctx, &dmv1.WatchResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, ws)
	}
	for _, ws := range streams {
		msg, err := ws.Recv()
		switch {
		case err == nil && msg.GetSynced() != nil:
			served++
		case status.Code(err) == codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("first message %v, %v", msg, err)
		}
	}
	if served != stream.DefaultSubscribers || refused != n-stream.DefaultSubscribers {
		t.Fatalf("%d served, %d refused; want %d and %d", served, refused, stream.DefaultSubscribers, n-stream.DefaultSubscribers)
	}
	if st := e.m.WatchStats(); st.Subscribers != stream.DefaultSubscribers {
		t.Fatalf("budget: %+v", st)
	}
}

// stalledWatch opens a WatchResources stream on its own connection, with
// the smallest flow-control windows gRPC allows and no dynamic window, and
// never reads it: the server's sends block once about 64 KiB are in flight.
func stalledWatch(t *testing.T, e *env) (grpc.ServerStreamingClient[dmv1.WatchResourcesResponse], context.CancelFunc) {
	t.Helper()
	conn, err := rpcutil.DialPeer(filepath.Join(e.root, "dm.sock"), grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := contextWithCancel(t)
	ws, err := dmv1.NewDeviceManagerServiceClient(conn).WatchResources(ctx, &dmv1.WatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = conn.Close() })
	return ws, cancel
}

// TestWatchBytesBounded: two subscribers that stop reading while a third
// keeps up. The messages the streams hold never pass the service's byte
// bound; the laggards are ended with RESOURCE_EXHAUSTED (by the service's
// bound or their own, depending on how far each got before its client's
// window closed) and their bytes are given back at once, while the
// subscriber that reads sees every change. A laggard that reads again gets
// what was in flight, then the error. Which bound ends which stream, and
// that a drained or closed queue gives its memory back, pkg/stream's
// TestSubscriberBounds, TestByteBudgetClosesTheLargestHolder and
// TestMemoryGivenBack show.
func TestWatchBytesBounded(t *testing.T) {
	// About 20 KiB a message: 100 devices with 200-byte IDs.
	var ids []string
	for i := range 100 {
		ids = append(ids, fmt.Sprintf("dev-%d-%s", i, strings.Repeat("x", 190)))
	}
	ids[0] = "dev-0"
	// A stalled stream stops sending after about 128 KiB (the client's
	// window and gRPC's write quota), then queues: the bounds are
	// reached after a few more messages.
	limits := stream.Limits{Bytes: 192 << 10, SubscriberBytes: 128 << 10}
	e := newEnvWatch(t, time.Minute, limits)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/big", DeviceIDs: ids}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/big", 100, 100)

	ctx, cancel := contextWithCancel(t)
	defer cancel()
	ws, err := e.client.WatchResources(ctx, &dmv1.WatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	reader := follow(t, ws, "example.com/big")
	s1, _ := stalledWatch(t, e)
	s2, _ := stalledWatch(t, e)
	testutil.WaitFor(t, "three streams open", func() bool { return e.m.WatchStats().Subscribers == 3 })

	flips := 0
	for healthy := false; e.m.WatchStats().Closed < 2; healthy = !healthy {
		if flips++; flips > 200 {
			t.Fatalf("no laggard evicted after %d changes: %+v", flips, e.m.WatchStats())
		}
		flip(t, p, healthy, 100, reader)
		if st := e.m.WatchStats(); st.Held > limits.Bytes {
			t.Fatalf("streams hold %d bytes, past the bound of %d", st.Held, limits.Bytes)
		}
	}
	// The laggards' queues are gone: what is held is at most the message
	// each stream is sending.
	if st := e.m.WatchStats(); st.Held > 3*(24<<10) {
		t.Fatalf("after the evictions the streams hold %d bytes", st.Held)
	}
	flip(t, p, flips%2 == 0, 100, reader)

	for _, s := range []grpc.ServerStreamingClient[dmv1.WatchResourcesResponse]{s1, s2} {
		got := 0
		for {
			if _, err = s.Recv(); err != nil {
				break
			}
			got++
		}
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "resubscribe") || got >= flips+2 {
			t.Fatalf("laggard: %d messages then %v; want fewer than %d, then RESOURCE_EXHAUSTED", got, err, flips+2)
		}
	}
	testutil.WaitFor(t, "the laggards gone and their bytes given back", func() bool {
		st := e.m.WatchStats()
		return st.Subscribers == 1 && st.Held == 0
	})
	flip(t, p, flips%2 != 0, 100, reader)
}

// TestWatchSnapshotMustFit: a new stream whose snapshot does not fit in the
// bytes left gets RESOURCE_EXHAUSTED, while the stream already open keeps
// working and a subscriber that omits the device IDs (a small snapshot) is
// served.
func TestWatchSnapshotMustFit(t *testing.T) {
	e := newEnvWatch(t, time.Minute, stream.Limits{Bytes: 48 << 10})
	ctx, cancel := contextWithCancel(t)
	defer cancel()
	ws, err := e.client.WatchResources(ctx, &dmv1.WatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	reader := follow(t, ws, "example.com/snap-a")
	// Three resources of about 20 KiB each: a message fits (two, even, if
	// the reader is slow), a snapshot of all three does not.
	var plugins []*sampleplugin.Plugin
	for _, name := range []string{"a", "b", "c"} {
		var ids []string
		for i := range 100 {
			ids = append(ids, fmt.Sprintf("dev-%d-%s", i, strings.Repeat("x", 190)))
		}
		ids[0] = "dev-0"
		p := e.plugin(name, sampleplugin.Options{Resource: "example.com/snap-" + name, DeviceIDs: ids}, false)
		e.mustRegister(p)
		e.waitCounts(p.Resource(), 100, 100)
		plugins = append(plugins, p)
	}
	for r := reader.next(t); r.GetAllocatable() != 100; r = reader.next(t) {
	}

	late, err := e.client.WatchResources(ctxT(t), &dmv1.WatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := late.Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "snapshot") {
		t.Fatalf("a stream whose snapshot does not fit: %v; want RESOURCE_EXHAUSTED", err)
	}
	flip(t, plugins[0], false, 100, reader)

	small, err := e.client.WatchResources(ctx, &dmv1.WatchResourcesRequest{OmitDeviceIds: true})
	if err != nil {
		t.Fatal(err)
	}
	follow(t, small, "example.com/snap-a")
}

// TestWatchOmitAllocationChanges: a subscriber that asks for no allocation
// changes gets no item for an Allocate or a Release, while a plain
// subscriber gets each; a change of health reaches both, with the
// resource's current free count.
func TestWatchOmitAllocationChanges(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/quiet"
	p := e.plugin("p", sampleplugin.Options{Resource: res, Devices: 4}, false)
	e.mustRegister(p)
	e.waitCounts(res, 4, 4)
	ctx, cancel := contextWithCancel(t)
	defer cancel()
	open := func(omit bool) *follower {
		ws, err := e.client.WatchResources(ctx, &dmv1.WatchResourcesRequest{OmitDeviceIds: true, OmitAllocationChanges: omit})
		if err != nil {
			t.Fatal(err)
		}
		return follow(t, ws, res)
	}
	all, quiet := open(false), open(true)

	for _, step := range []struct {
		call func() error
		free int64
	}{
		{func() error { _, err := e.client.Allocate(ctxT(t), allocReq("pod1", "c", res, 2)); return err }, 2},
		{func() error { _, err := e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "pod1"}); return err }, 4},
		{func() error { _, err := e.client.Allocate(ctxT(t), allocReq("pod2", "c", res, 2)); return err }, 2},
	} {
		if err := step.call(); err != nil {
			t.Fatal(err)
		}
		if r := all.next(t); r.GetFree() != step.free || r.GetAllocatable() != 4 {
			t.Fatalf("plain subscriber: free %d allocatable %d, want %d and 4", r.GetFree(), r.GetAllocatable(), step.free)
		}
	}
	// pod2 holds dev-0 and dev-1; dev-3 turns unhealthy.
	if err := p.SetHealth("dev-3", false); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]*follower{"plain": all, "quiet": quiet} {
		if r := f.next(t); r.GetAllocatable() != 3 || r.GetFree() != 1 {
			t.Fatalf("%s subscriber's next change: allocatable %d free %d, want the health change (3, 1)", name, r.GetAllocatable(), r.GetFree())
		}
	}
	select {
	case r := <-quiet.changes:
		t.Fatalf("quiet subscriber got another change: %v", r)
	default:
	}
}
