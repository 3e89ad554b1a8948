// Package endpoint is the devicemanager's connection to one device plugin:
// it dials the plugin's socket, gets its options, opens its ListAndWatch
// stream and turns each update into the plugin's devices and their health,
// and it makes the calls an allocation needs (GetPreferredAllocation,
// Allocate, PreStartContainer), each with its own timeout.
//
// It is the client-side boundary to the v1beta1 DevicePlugin API, as
// package server is the server-side one: a plugin's gRPC error comes back as
// an errdefs sentinel (ErrUnavailable when the plugin could not be reached
// or did not answer in time, ErrInternal when it answered with an error),
// with the plugin's message in the kubelet's wording. The plugin's
// ContainerAllocateResponse is passed on as the plugin sent it, in the
// kubelet's own type: it is stored and returned byte for byte.
//
// The stream is never reopened (as in the kubelet): when it ends, the
// plugin must register again.
package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
)

// Timeouts of the calls to plugins.
const (
	optionsTimeout   = 10 * time.Second
	preferredTimeout = 10 * time.Second
	allocateTimeout  = 30 * time.Second
	preStartTimeout  = pluginapi.KubeletPreStartContainerRPCTimeoutInSecs * time.Second
)

// RefusedRetry is how long a connection that an endpoint's socket refuses
// is retried before the call that needs it fails: the gap between a
// plugin's bind() and its listen(), in which the socket file exists and
// refuses (DESIGN "Dialling a new socket"). A socket nothing listens on
// fails after it, not after the kubelet's 10 s. Tests may change it.
var RefusedRetry = 50 * time.Millisecond

// gapConnectParams reconnect within milliseconds, through that gap.
var gapConnectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: time.Millisecond, Multiplier: 2, MaxDelay: 10 * time.Millisecond},
	MinConnectTimeout: optionsTimeout,
}

// waitConnected connects conn and waits until it is ready, budget has
// passed or ctx ends, whichever comes first; meanwhile refused connections
// are retried with a millisecond backoff (gapConnectParams). The call that
// follows reports any failure.
func waitConnected(ctx context.Context, conn *grpc.ClientConn, budget time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	conn.Connect()
	for {
		st := conn.GetState()
		switch st {
		case connectivity.Ready, connectivity.Shutdown:
			return
		case connectivity.Idle:
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, st) {
			return
		}
	}
}

var tracer = telemetry.Tracer("github.com/nodeplug/nodeplug/services/devicemanager")

// Options are what a plugin answered to GetDevicePluginOptions.
type Options struct {
	PreStartRequired    bool
	PreferredAllocation bool // GetPreferredAllocationAvailable
}

// Device is one device of a ListAndWatch update.
type Device struct {
	ID        string
	Healthy   bool
	NUMANodes []int64 // from the device's topology: nil when it has none, empty when it has no nodes
}

// Plugin is a connected device plugin, as allocation uses it. Every method
// is safe for concurrent use, and every call has its own timeout. Errors
// wrap errdefs.ErrUnavailable or errdefs.ErrInternal and name the plugin.
type Plugin interface {
	// String names the plugin in messages: "<resource> (<endpoint path>)".
	String() string
	Options() Options
	// GetPreferredAllocation returns the plugin's choice of size devices
	// among available, including mustInclude, as it answered it (unchecked).
	GetPreferredAllocation(ctx context.Context, available, mustInclude []string, size int) ([]string, error)
	// Allocate asks the plugin to allocate ids to one container.
	Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error)
	// PreStartContainer tells the plugin the container with ids is about
	// to start.
	PreStartContainer(ctx context.Context, ids []string) error
}

// Conn is an open connection to one device plugin, with its ListAndWatch
// stream. Run receives the stream; Close ends both. Every method is safe for
// concurrent use.
type Conn struct {
	resource string
	path     string // as registered, for messages
	opts     Options
	conn     *grpc.ClientConn
	client   pluginapi.DevicePluginClient
	stream   grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse]
	cancel   context.CancelFunc

	mu        sync.Mutex
	firstSpan trace.Span // until the first update, or the end
}

var _ Plugin = (*Conn)(nil)

// Connect dials the plugin of resource at path (the endpoint as
// registered) with dial, calls GetDevicePluginOptions and opens
// ListAndWatch. It returns once the stream is open; Run then receives its
// updates. gRPC calls dial for the first connection and for every
// reconnect (after a GOAWAY or a broken connection), so the check that
// dial makes (unixsock.Confiner.Dialer: confinement, and the socket's
// identity) is made on every socket the plugin's calls reach.
//
// Tracing: a span "connect <resource>" (with "GetDevicePluginOptions"
// beneath it) is a child of ctx, and the stream carries ctx's trace. A span
// "first ListAndWatch update", also a child of ctx, ends when the first
// update arrives, or with an error when the stream ends or Close is called
// before it. The span names path.
func Connect(ctx context.Context, resource, path string, dial func(context.Context, string) (net.Conn, error)) (*Conn, error) {
	cctx, span := tracer.Start(ctx, "connect "+resource, trace.WithAttributes(attribute.String("nodeplug.plugin.endpoint", path)))
	defer span.End()
	fail := func(err error) (*Conn, error) {
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	conn, err := rpcutil.DialPlugin(path, grpc.WithConnectParams(gapConnectParams), grpc.WithContextDialer(dial))
	if err != nil {
		return fail(kubeletrules.New("failed to dial device plugin: "+err.Error(), "", errdefs.ErrUnavailable))
	}
	waitConnected(cctx, conn, RefusedRetry)
	client := pluginapi.NewDevicePluginClient(conn)
	octx, ospan := tracer.Start(cctx, "GetDevicePluginOptions")
	octx, cancel := context.WithTimeout(octx, optionsTimeout)
	opts, err := client.GetDevicePluginOptions(octx, &pluginapi.Empty{})
	cancel()
	if err != nil {
		ospan.SetStatus(codes.Error, err.Error())
		ospan.End()
		_ = conn.Close()
		return fail(kubeletrules.New("failed to get device plugin options: "+err.Error(),
			fmt.Sprintf("failed to get device plugin options for %s at %s: %s", resource, path, status.Convert(err).Message()),
			kind(err)))
	}
	ospan.End()
	// The stream outlives ctx (a request's): it keeps only its trace.
	sctx, scancel := context.WithCancel(trace.ContextWithSpanContext(context.Background(), trace.SpanContextFromContext(cctx)))
	stream, err := client.ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		scancel()
		_ = conn.Close()
		return fail(fmt.Errorf("failed to open ListAndWatch of %s at %s: %s: %w", resource, path, status.Convert(err).Message(), kind(err)))
	}
	c := &Conn{
		resource: resource, path: path, conn: conn, client: client, stream: stream, cancel: scancel,
		opts: Options{PreStartRequired: opts.GetPreStartRequired(), PreferredAllocation: opts.GetGetPreferredAllocationAvailable()},
	}
	_, c.firstSpan = tracer.Start(ctx, "first ListAndWatch update")
	return c, nil
}

// kind classifies a plugin call error: transport problems are
// ErrUnavailable, anything else the plugin said is ErrInternal.
func kind(err error) error {
	switch status.Code(err) {
	case grpccodes.Unavailable, grpccodes.DeadlineExceeded, grpccodes.Canceled:
		return errdefs.ErrUnavailable
	}
	return errdefs.ErrInternal
}

// callError describes a failed call to the plugin, naming it, with the
// reason that puts the fault on the plugin rather than the devicemanager
// (errdefs.ReasonDevicePluginUnreachable, or ReasonDevicePluginFailed for
// any other failure) and the plugin's resource, socket and the call.
func (c *Conn) callError(call string, err error) error {
	k := kind(err)
	reason := errdefs.ReasonDevicePluginFailed
	if k == errdefs.ErrUnavailable {
		reason = errdefs.ReasonDevicePluginUnreachable
	}
	return errdefs.WithReason(
		fmt.Errorf("device plugin %s %s rpc failed with err: %s: %w", c, call, status.Convert(err).Message(), k),
		reason, map[string]string{errdefs.MetaResource: c.resource, errdefs.MetaSocket: c.path, errdefs.MetaCall: call})
}

// String implements Plugin.
func (c *Conn) String() string { return c.resource + " (" + c.path + ")" }

// Options implements Plugin.
func (c *Conn) Options() Options { return c.opts }

// Run receives ListAndWatch updates and passes each device list to update,
// in the order they arrive, until the stream ends; it returns why it ended.
// Call it once. After Close it returns soon, with an error.
//
// Run is meant to be the body of a goroutine that lives as long as the
// plugin, and its stack is kept that long: it does nothing but receive,
// and leaves the rest to update and to ended, which are called rarely, so
// that the stack stays at its smallest size (receiving alone comes close
// to filling the smallest stack Go gives a goroutine; a few more frames
// double it).
func (c *Conn) Run(update func([]Device)) error {
	resp, err := c.stream.Recv()
	if err != nil {
		return c.ended(err)
	}
	c.endFirstSpan(nil)
	for {
		update(devices(resp.GetDevices()))
		if resp, err = c.stream.Recv(); err != nil {
			return c.ended(err)
		}
	}
}

// ended returns why the stream ended (err, from Recv) and records it on
// the first update's span if that has not arrived.
func (c *Conn) ended(err error) error {
	err = fmt.Errorf("ListAndWatch of %s ended: %s: %w", c, status.Convert(err).Message(), kind(err))
	c.endFirstSpan(err)
	return err
}

func devices(in []*pluginapi.Device) []Device {
	out := make([]Device, 0, len(in))
	for _, d := range in {
		nd := Device{ID: d.GetID(), Healthy: d.GetHealth() == pluginapi.Healthy}
		if d.GetTopology() != nil {
			// A topology without nodes stays non-nil: the pod resources
			// API tells it from no topology, as the kubelet does.
			nd.NUMANodes = make([]int64, 0, len(d.GetTopology().GetNodes()))
		}
		for _, n := range d.GetTopology().GetNodes() {
			nd.NUMANodes = append(nd.NUMANodes, n.GetID())
		}
		out = append(out, nd)
	}
	return out
}

// Close ends the stream and the connection. why, when the first update has
// not arrived yet, is recorded on its span. Close may be called more than
// once.
func (c *Conn) Close(why error) {
	if why == nil {
		why = errors.New("closed")
	}
	c.endFirstSpan(why)
	c.cancel()
	_ = c.conn.Close()
}

func (c *Conn) endFirstSpan(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.firstSpan == nil {
		return
	}
	if err != nil {
		c.firstSpan.SetStatus(codes.Error, err.Error())
	}
	c.firstSpan.End()
	c.firstSpan = nil
}

// GetPreferredAllocation implements Plugin.
func (c *Conn) GetPreferredAllocation(ctx context.Context, available, mustInclude []string, size int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, preferredTimeout)
	defer cancel()
	resp, err := c.client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: available, MustIncludeDeviceIDs: mustInclude, AllocationSize: int32(size),
		}},
	})
	if err != nil {
		return nil, c.callError("GetPreferredAllocation", err)
	}
	if crs := resp.GetContainerResponses(); len(crs) > 0 {
		return crs[0].GetDeviceIDs(), nil
	}
	return nil, nil
}

// Allocate implements Plugin.
func (c *Conn) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, allocateTimeout)
	defer cancel()
	resp, err := c.client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
	})
	if err != nil {
		return nil, c.callError("Allocate", err)
	}
	if len(resp.GetContainerResponses()) == 0 {
		return nil, fmt.Errorf("device plugin %s: no containers return in allocation response %v: %w", c, resp, errdefs.ErrInternal)
	}
	return resp.GetContainerResponses()[0], nil
}

// PreStartContainer implements Plugin.
func (c *Conn) PreStartContainer(ctx context.Context, ids []string) error {
	ctx, cancel := context.WithTimeout(ctx, preStartTimeout)
	defer cancel()
	if _, err := c.client.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids}); err != nil {
		return c.callError("PreStartContainer", err)
	}
	return nil
}
