package access

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/nodeplug/nodeplug/pkg/stream"
)

// fakeStream is a server stream whose context carries a peer identity.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f fakeStream) Context() context.Context { return f.ctx }

// asUnix returns a stream of a Unix caller with uid, in role.
func asUnix(uid uint32, role Role) fakeStream {
	c := Caller{Unix: &UnixCred{UID: uid, GID: uid, PID: 1}, Role: role}
	return fakeStream{ctx: peer.NewContext(context.Background(), &peer.Peer{AuthInfo: authInfo{
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, caller: c}})}
}

var (
	watchInfo  = &grpc.StreamServerInfo{FullMethod: "/nodeplug.watcher.v1.WatcherService/WatchSocketEvents", IsServerStream: true}
	healthInfo = &grpc.StreamServerInfo{FullMethod: "/grpc.health.v1.Health/Watch", IsServerStream: true}
)

// hold runs a Watch handler that stays open until the returned function is
// called; it fails the test when the stream is refused.
func hold(t *testing.T, w *WatchBounds, ss grpc.ServerStream, info *grpc.StreamServerInfo) (end func()) {
	t.Helper()
	entered, done := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- w.Stream(nil, ss, info, func(any, grpc.ServerStream) error {
			close(entered)
			<-done
			return nil
		})
	}()
	select {
	case <-entered:
	case err := <-errc:
		t.Fatalf("%s refused: %v", info.FullMethod, err)
	}
	return func() {
		close(done)
		if err := <-errc; err != nil {
			t.Errorf("the handler's end: %v", err)
		}
	}
}

// call runs a Watch handler that returns at once and gives its error.
func call(w *WatchBounds, ss grpc.ServerStream, info *grpc.StreamServerInfo) error {
	return w.Stream(nil, ss, info, func(any, grpc.ServerStream) error { return nil })
}

// On the API socket each uid is one caller: readers and operators each to
// their own bound; root and the service's own uid (internal) take the kept
// slots; health's Watch is not counted.
func TestWatchBoundsByUID(t *testing.T) {
	w := NewWatchBounds(stream.SlotLimits{Total: 6, PerCaller: 2, Reserved: 2}, nil)
	var ends []func()
	for i := 0; i < 2; i++ {
		ends = append(ends, hold(t, w, asUnix(1000, RoleReader), watchInfo), hold(t, w, asUnix(1001, RoleOperator), watchInfo))
	}
	err := call(w, asUnix(1000, RoleReader), watchInfo)
	if !errors.Is(err, stream.ErrPerCallerBound) || !strings.Contains(err.Error(), "uid 1000 holds 2") || !strings.Contains(err.Error(), watchInfo.FullMethod) {
		t.Fatalf("uid 1000's third stream: %v, want the per-caller bound naming uid 1000 and the method", err)
	}
	if err := call(w, asUnix(1002, RoleReader), watchInfo); !errors.Is(err, stream.ErrTotalBound) {
		t.Fatalf("uid 1002 with the shared slots held: %v, want the total bound", err)
	}
	// Health's Watch stays open to anyone.
	for i := 0; i < 4; i++ {
		ends = append(ends, hold(t, w, asUnix(1000, RoleReader), healthInfo))
	}
	ends = append(ends, hold(t, w, asUnix(0, RoleInternal), watchInfo), hold(t, w, asUnix(4242, RoleInternal), watchInfo))
	if err := call(w, asUnix(0, RoleInternal), watchInfo); !errors.Is(err, stream.ErrTotalBound) {
		t.Fatalf("root at the total: %v, want the total bound", err)
	}
	for _, end := range ends {
		end()
	}
	if st := w.Slots(watchInfo.FullMethod).Stats(); st != (stream.SlotStats{}) {
		t.Fatalf("slots %+v once every stream ended, want none", st)
	}
}

// A handler that fails or panics gives its slot back; a call without an
// identity (only the Guard's open mode lets one through) counts as
// internal.
func TestWatchBoundsRelease(t *testing.T) {
	w := NewWatchBounds(stream.SlotLimits{Total: 2, PerCaller: 1, Reserved: 1}, nil)
	failing := errors.New("send failed")
	for i := 0; i < 3; i++ {
		if err := w.Stream(nil, asUnix(1000, RoleReader), watchInfo, func(any, grpc.ServerStream) error { return failing }); !errors.Is(err, failing) {
			t.Fatalf("handler error %v, want %v", err, failing)
		}
	}
	func() {
		defer func() { _ = recover() }()
		_ = w.Stream(nil, asUnix(1000, RoleReader), watchInfo, func(any, grpc.ServerStream) error { panic("boom") })
	}()
	if st := w.Slots(watchInfo.FullMethod).Stats(); st != (stream.SlotStats{}) {
		t.Fatalf("slots %+v after failed handlers, want none", st)
	}
	anon := fakeStream{ctx: context.Background()}
	end := hold(t, w, anon, watchInfo)
	end2 := hold(t, w, anon, watchInfo)
	if err := call(w, asUnix(1000, RoleReader), watchInfo); !errors.Is(err, stream.ErrTotalBound) {
		t.Fatalf("a reader with both slots held by unidentified calls: %v, want the total bound", err)
	}
	end()
	end2()
}
