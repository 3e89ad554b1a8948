package errdefs

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Every status ToGRPC makes says that a nodeplug service answered, with
// the reason the error carries or the code's name; a transport's status
// does not.
func TestReasons(t *testing.T) {
	driverDown := WithReason(fmt.Errorf("DRA driver d (socket %q): refused: %w", "/s.sock", ErrUnavailable),
		ReasonDRADriverUnreachable, map[string]string{MetaDriver: "d", MetaSocket: "/s.sock"})
	for _, tc := range []struct {
		name   string
		err    error
		reason string
		meta   map[string]string
	}{
		{"plain sentinel", fmt.Errorf("x: %w", ErrFailedPrecondition), "FAILED_PRECONDITION", nil},
		{"no sentinel", errors.New("plain"), "UNKNOWN", nil},
		{"reason, wrapped further", fmt.Errorf("prepare: %w", driverDown), ReasonDRADriverUnreachable, map[string]string{MetaDriver: "d", MetaSocket: "/s.sock"}},
		{"reason in a join", errors.Join(errors.New("other"), driverDown), ReasonDRADriverUnreachable, map[string]string{MetaDriver: "d", MetaSocket: "/s.sock"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := ToGRPC(tc.err)
			if status.Convert(g).Message() != tc.err.Error() {
				t.Errorf("message %q, want %q", status.Convert(g).Message(), tc.err.Error())
			}
			info, ok := InfoOf(g)
			if !ok || info.GetReason() != tc.reason || fmt.Sprint(info.GetMetadata()) != fmt.Sprint(tc.meta) {
				t.Fatalf("InfoOf = %v, %v; want reason %s, metadata %v", info, ok, tc.reason, tc.meta)
			}
		})
	}
	if _, ok := InfoOf(status.Error(codes.Unavailable, "connection error: desc = refused")); ok {
		t.Error("a status without the detail has an ErrorInfo")
	}
	if _, ok := InfoOf(errors.New("not a status")); ok {
		t.Error("a plain error has an ErrorInfo")
	}
	// A message that is not UTF-8 cannot travel with details: the status
	// keeps its code and message.
	bad := ToGRPC(fmt.Errorf("name \xff: %w", ErrInvalidArgument))
	if status.Code(bad) != codes.InvalidArgument || status.Convert(bad).Message() != "name \xff: invalid argument" {
		t.Errorf("non-UTF-8 message: %v", bad)
	}
	if WithReason(nil, ReasonDRADriverFailed, nil) != nil {
		t.Error("WithReason(nil) is not nil")
	}
}
