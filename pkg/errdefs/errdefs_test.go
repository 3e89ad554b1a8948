package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("resource %q: %w", "example.com/r", ErrNotFound), codes.NotFound},
		{fmt.Errorf("bad: %w", ErrInvalidArgument), codes.InvalidArgument},
		{fmt.Errorf("few: %w", ErrFailedPrecondition), codes.FailedPrecondition},
		{fmt.Errorf("plugin: %w", ErrUnavailable), codes.Unavailable},
		{fmt.Errorf("update resourceclaims/binding: %w", ErrPermissionDenied), codes.PermissionDenied},
		{fmt.Errorf("list: %w: %w", ErrPermissionDenied, ErrUnavailable), codes.PermissionDenied},
		{fmt.Errorf("list: %w: %w", ErrUnavailable, ErrPermissionDenied), codes.PermissionDenied},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{errors.New("plain"), codes.Unknown},
		{status.Error(codes.Aborted, "kept"), codes.Aborted},
	} {
		g := ToGRPC(tc.err)
		if got := status.Code(g); got != tc.code {
			t.Errorf("ToGRPC(%v) code = %v, want %v", tc.err, got, tc.code)
		}
		if s, _ := status.FromError(g); s.Message() != tc.err.Error() && tc.code != codes.Aborted {
			t.Errorf("message %q, want %q", s.Message(), tc.err.Error())
		}
		if tc.code == codes.Unknown || tc.code == codes.Aborted {
			continue
		}
		back := FromGRPC(g)
		if Code(back) != tc.code {
			t.Errorf("FromGRPC(ToGRPC(%v)) code = %v, want %v", tc.err, Code(back), tc.code)
		}
	}
	if ToGRPC(nil) != nil || FromGRPC(nil) != nil {
		t.Fatal("nil must stay nil")
	}
}
