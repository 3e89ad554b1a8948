package kubeletrules

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

func TestErrorTexts(t *testing.T) {
	e := New("failed to dial device plugin: context deadline exceeded", "endpoint /x did not appear", errdefs.ErrUnavailable)
	if got, want := e.Error(), "endpoint /x did not appear: unavailable"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, errdefs.ErrUnavailable) || errdefs.Code(e) != codes.Unavailable {
		t.Fatalf("%v: not unavailable (code %v)", e, errdefs.Code(e))
	}
	if got := New("bad name", "", errdefs.ErrInvalidArgument).Error(); got != "bad name: invalid argument" {
		t.Fatalf("no detail: Error() = %q", got)
	}
	wrapped := fmt.Errorf("registering: %w", e)
	if got, ok := Message(wrapped); !ok || got != e.Kubelet {
		t.Fatalf("Message = %q, %v; want %q", got, ok, e.Kubelet)
	}
	if got := Told(wrapped); got != e.Kubelet {
		t.Fatalf("Told(worded) = %q", got)
	}
	plain := fmt.Errorf("resource r: %w", errdefs.ErrNotFound)
	if _, ok := Message(plain); ok {
		t.Fatalf("Message found words in %v", plain)
	}
	if got := Told(plain); got != "resource r" {
		t.Fatalf("Told(plain) = %q, want the sentinel stripped", got)
	}
	// Only a sentinel the error wraps is stripped.
	if got := Plain(errors.New("x: not found")); got != "x: not found" {
		t.Fatalf("Plain stripped an unwrapped suffix: %q", got)
	}
}

// TestStatusRoundTrip encodes as the devicemanager does and decodes as the
// reconciler does, through the marshaled google.rpc.Status that gRPC sends.
func TestStatusRoundTrip(t *testing.T) {
	e := Wrap("device plugin already connected: /s\xff", fmt.Errorf("endpoint /s is live: %w", errdefs.ErrAlreadyExists))
	sent := Status(fmt.Errorf("outer: %w", e))
	st, ok := status.FromError(sent)
	if !ok || st.Code() != codes.AlreadyExists {
		t.Fatalf("Status = %v, want an AlreadyExists status", sent)
	}
	b, err := proto.Marshal(st.Proto())
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var got spb.Status
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	msg, ok := FromStatus(status.FromProto(&got).Err())
	if !ok || msg != "device plugin already connected: /s\uFFFD" {
		t.Fatalf("FromStatus = %q, %v", msg, ok)
	}
	plain := fmt.Errorf("r: %w", errdefs.ErrNotFound)
	if Status(plain) != plain {
		t.Fatalf("Status changed an error without the kubelet's words")
	}
	if _, ok := FromStatus(status.Error(codes.NotFound, "r")); ok {
		t.Fatalf("FromStatus found words in a status without the detail")
	}
}
