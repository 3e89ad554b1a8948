package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// failingDM answers PrepareResources and Allocate with err, mapped to a
// status as the services' interceptor maps it (errdefs.ToGRPC).
type failingDM struct {
	dmv1.UnimplementedDRAServiceServer
	dmv1.UnimplementedDeviceManagerServiceServer
	err error
}

func (f failingDM) PrepareResources(context.Context, *dmv1.PrepareResourcesRequest) (*dmv1.PrepareResourcesResponse, error) {
	return nil, errdefs.ToGRPC(f.err)
}

func (f failingDM) Allocate(context.Context, *dmv1.AllocateRequest) (*dmv1.AllocateResponse, error) {
	return nil, errdefs.ToGRPC(f.err)
}

// serveFailing serves failingDM{err} as both of the devicemanager's
// services and returns its socket.
func serveFailing(t *testing.T, err error) string {
	t.Helper()
	return serveFake(t, func(s *grpc.Server) {
		dmv1.RegisterDRAServiceServer(s, failingDM{err: err})
		dmv1.RegisterDeviceManagerServiceServer(s, failingDM{err: err})
	})
}

// An UNAVAILABLE the dramanager answers is never "cannot reach the
// dramanager", whatever words its message holds: a DRA driver that
// cannot be reached, failed or is not registered is said as the driver's
// fault, naming it and its socket; another UNAVAILABLE as the
// dramanager's answer. Only a transport failure is "cannot reach".
func TestDriverFaultsAreNotTheDRAManagers(t *testing.T) {
	const sock = "/var/lib/kubelet/plugins/gpu.example.com/dra.sock"
	meta := map[string]string{errdefs.MetaDriver: "gpu.example.com", errdefs.MetaSocket: sock, errdefs.MetaCall: "NodePrepareResources"}
	driverErr := func(reason, msg string, kind error) error {
		return fmt.Errorf("prepare ResourceClaim default/c: driver gpu.example.com: %w",
			errdefs.WithReason(fmt.Errorf("DRA driver gpu.example.com (socket %q): NodePrepareResources: %s: %w", sock, msg, kind), reason, meta))
	}
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"driver down", driverErr(errdefs.ReasonDRADriverUnreachable, "connection error: dial unix: connect: connection refused", errdefs.ErrUnavailable),
			[]string{"DRA driver gpu.example.com is not reachable at " + sock, "the driver is at fault, not the dramanager", "connection refused"}},
		{"driver failed", driverErr(errdefs.ReasonDRADriverFailed, "boom", errdefs.ErrInternal),
			[]string{"DRA driver gpu.example.com (socket " + sock + ") failed", "the driver is at fault, not the dramanager", "boom"}},
		{"driver not registered", errdefs.WithReason(fmt.Errorf("DRA driver gpu.example.com is not registered on this node: %w", errdefs.ErrUnavailable),
			errdefs.ReasonDRADriverNotRegistered, map[string]string{errdefs.MetaDriver: "gpu.example.com"}),
			[]string{"DRA driver gpu.example.com is not registered on this node — start it"}},
		{"the dramanager's own", fmt.Errorf("reserve ResourceClaim default/c: Get \"https://127.0.0.1/\": EOF: %w", errdefs.ErrUnavailable),
			[]string{"EOF: unavailable (the dramanager at ", "says: unavailable)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveFailing(t, tc.err)
			code, _, errOut := runCLI(t, "--dramanager-addr", addr, "prepare", "--pod-uid", "u", "--namespace", "default", "--name", "p",
				"--claim", "c=c", "--container", "main=c")
			if code != exitError || strings.Contains(errOut, "cannot reach the dramanager") {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("output lacks %q:\n%s", w, errOut)
				}
			}
		})
	}
	code, _, errOut := runCLI(t, "--dramanager-addr", "/nonexistent/dramanager.sock", "prepare", "--pod-uid", "u", "--namespace", "default",
		"--name", "p", "--claim", "c=c", "--container", "main=c")
	if code != exitError || !strings.Contains(errOut, "cannot reach the dramanager at /nonexistent/dramanager.sock") {
		t.Errorf("no dramanager: exit %d: %s", code, errOut)
	}
}

// A device plugin that cannot be reached or fails its call is said as the
// plugin's fault, naming its resource, its socket and the call, not as the
// devicemanager's.
func TestDevicePluginFaultsAreNotTheDevicemanagers(t *testing.T) {
	const sock = "/var/lib/kubelet/device-plugins/gpu.sock"
	meta := map[string]string{errdefs.MetaResource: "example.com/gpu", errdefs.MetaSocket: sock, errdefs.MetaCall: "Allocate"}
	for _, tc := range []struct {
		name   string
		reason string
		kind   error
		want   []string
	}{
		{"plugin down", errdefs.ReasonDevicePluginUnreachable, errdefs.ErrUnavailable,
			[]string{"the device plugin of example.com/gpu did not answer Allocate at " + sock, "the plugin is at fault, not the devicemanager", "says no"}},
		{"plugin failed", errdefs.ReasonDevicePluginFailed, errdefs.ErrInternal,
			[]string{"the device plugin of example.com/gpu (socket " + sock + ") failed Allocate", "the plugin is at fault, not the devicemanager", "says no"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := errdefs.WithReason(fmt.Errorf("device plugin example.com/gpu (%s) Allocate rpc failed with err: says no: %w", sock, tc.kind), tc.reason, meta)
			addr := serveFailing(t, err)
			code, _, errOut := runCLI(t, "--devicemanager-addr", addr, "allocate", "--pod", "p", "--container", "c", "example.com/gpu=1")
			if code != exitError || strings.Contains(errOut, "cannot reach the devicemanager") {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("output lacks %q:\n%s", w, errOut)
				}
			}
		})
	}
}

// traceRecorder answers ListResources and Allocate and records the trace
// context each call came with.
type traceRecorder struct {
	dmv1.UnimplementedDeviceManagerServiceServer
	mu      sync.Mutex
	parents map[string][]string // by method: the traceparent headers
}

func (f *traceRecorder) record(ctx context.Context, method string) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.parents[method] = append(f.parents[method], strings.Join(md.Get("traceparent"), ","))
}

func (f *traceRecorder) ListResources(ctx context.Context, _ *dmv1.ListResourcesRequest) (*dmv1.ListResourcesResponse, error) {
	f.record(ctx, "ListResources")
	return &dmv1.ListResourcesResponse{}, nil
}

func (f *traceRecorder) Allocate(ctx context.Context, _ *dmv1.AllocateRequest) (*dmv1.AllocateResponse, error) {
	f.record(ctx, "Allocate")
	return &dmv1.AllocateResponse{}, nil
}

// A read's calls say "not sampled" (W3C trace flags 00), so the services
// make no trace of them; a write's carry no trace context, and the service
// traces each as its own. Whatever ran before: a read then a write, and a
// write then a read.
func TestReadsAreNotTraced(t *testing.T) {
	f := &traceRecorder{parents: map[string][]string{}}
	addr := serveFake(t, func(s *grpc.Server) { dmv1.RegisterDeviceManagerServiceServer(s, f) })
	for _, args := range [][]string{
		{"resources"},
		{"allocate", "--pod", "p", "--container", "c", "example.com/x=1"},
		{"resources"},
	} {
		if code, _, errOut := runCLI(t, append([]string{"--devicemanager-addr", addr}, args...)...); code != exitOK {
			t.Fatalf("%q: exit %d: %s", args, code, errOut)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	reads, writes := f.parents["ListResources"], f.parents["Allocate"]
	if len(reads) != 2 || len(writes) != 1 {
		t.Fatalf("calls seen: %v", f.parents)
	}
	for _, tp := range reads {
		if !strings.HasPrefix(tp, "00-") || !strings.HasSuffix(tp, "-00") {
			t.Errorf("a read came with traceparent %q, want one that says not sampled (00-…-00)", tp)
		}
	}
	if writes[0] != "" {
		t.Errorf("a write came with traceparent %q, want none: the service traces it as its own", writes[0])
	}
}

// A permission the cluster's API refused the dramanager points at the role
// deploy/rbac ships; any other PERMISSION_DENIED at nodeplug's own roles.
func TestAPIRefusalPointsAtTheClusterRole(t *testing.T) {
	refused := errdefs.WithReason(
		fmt.Errorf(`reserve ResourceClaim default/c: the Kubernetes API refused update on resourceclaims/binding (resource.k8s.io) to user "nodeplug:node-a": %w`, errdefs.ErrPermissionDenied),
		errdefs.ReasonKubernetesAPIDenied, map[string]string{errdefs.MetaVerb: "update", errdefs.MetaResource: "resourceclaims/binding"})
	for _, tc := range []struct {
		name      string
		err       error
		want, not string
	}{
		{"the cluster's API", refused, "(docs/dra-drivers.md#with-a-cluster)", "docs/security.md"},
		{"nodeplug's own roles", fmt.Errorf("operator role required: %w", errdefs.ErrPermissionDenied), "(docs/security.md)", "with-a-cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveFailing(t, tc.err)
			code, _, errOut := runCLI(t, "--dramanager-addr", addr, "prepare", "--pod-uid", "u", "--namespace", "default", "--name", "p",
				"--claim", "c=c", "--container", "main=c")
			if code != exitError || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, tc.not) {
				t.Fatalf("exit %d, want %q and not %q in:\n%s", code, tc.want, tc.not, errOut)
			}
		})
	}
}
