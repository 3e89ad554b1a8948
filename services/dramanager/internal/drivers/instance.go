package drivers

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/stats"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// Instance is the state of one registered instance of a driver.
type Instance struct {
	Driver          string
	Endpoint        string
	SocketPath      string
	Generation      string
	OfferedServices []string
	// Service is the DRA service used: v1.DRAPlugin or v1beta1.DRAPlugin.
	Service string
	// HealthService is the DRAResourceHealth service offered, "" if none.
	HealthService string
	Connected     bool
	State         connectivity.State
	// Serving: the instance that serves the driver's calls.
	Serving     bool
	Registered  time.Time
	StateChange time.Time
	LastError   string
}

// Driver is a driver with its instances, oldest first.
type Driver struct {
	Name      string
	Instances []Instance
	// SliceDeletion is when the driver's slices are deleted unless an
	// instance connects before; zero while one is connected or no deletion
	// is pending.
	SliceDeletion time.Time
}

// connectParams: a connection lost is tried again soon (a GOAWAY, a
// driver's server restarting in place on the same socket), and refused
// connections through a socket's bind→listen gap within milliseconds.
var connectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 2, Jitter: 0.2, MaxDelay: 2 * time.Second},
	MinConnectTimeout: 10 * time.Second,
}

// instance is one registered instance and its connection. The fields up
// to conn are fixed at registration; the rest are guarded by the
// registry's mu.
type instance struct {
	r             *Registry
	driver        string
	endpoint      string
	socketPath    string
	generation    string
	offered       []string
	service       string
	healthService string
	registered    time.Time
	conn          *grpc.ClientConn
	ctx           context.Context
	cancel        context.CancelFunc

	transports  uint64 // transports made and gone (connWatch)
	connected   bool
	stateChange time.Time
	lastError   string
	removed     bool
	health      map[string]deviceHealth // by pool/device, from NodeWatchResources (health.go)
}

// dial makes the instance's connection (not connected yet: start
// connects it). The connection reaches only the socket identified at
// registration: the Confiner's dialer checks confinement at every dial
// and the pin refuses another socket at the path (a driver started anew
// registers anew, with a new generation). Called with r.mu held.
func (r *Registry) dial(reg Registration, service, dialPath string, id unixsock.Identity) (*instance, error) {
	in := &instance{
		r: r, driver: reg.Driver, endpoint: reg.Endpoint, socketPath: reg.SocketPath, generation: reg.Generation,
		offered: slices.Clone(reg.Services), service: service, healthService: pickHealthService(reg.Services),
		registered: r.now(),
	}
	in.stateChange = in.registered
	dialer := r.confiner.Dialer(reg.Endpoint, unixsock.NewPin(id))
	in.ctx, in.cancel = context.WithCancel(r.ctx)
	conn, err := rpcutil.DialPlugin(reg.Endpoint, grpc.WithConnectParams(connectParams), grpc.WithStatsHandler(connWatch{in}),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := dialer(ctx, addr)
			if err != nil {
				in.dialFailed(err)
			}
			return c, err
		}))
	if err != nil {
		in.cancel()
		return nil, fmt.Errorf("failed to create gRPC connection to DRA driver %s at endpoint %s (dialled as %s): %w: %w",
			reg.Driver, bounds.Quote(reg.Endpoint), bounds.Quote(dialPath), err, errdefs.ErrUnavailable)
	}
	in.conn = conn
	return in, nil
}

func pickHealthService(offered []string) string {
	for _, s := range HealthServices {
		if slices.Contains(offered, s) {
			return s
		}
	}
	return ""
}

// start connects. The connection is followed by gRPC's stats handler
// (connWatch), as the kubelet's DRA plugin manager follows its drivers:
// no goroutine held for the connection's life (one waits only while a new
// transport awaits the driver's answer), and a connection lost is
// connected again.
func (in *instance) start(wg *sync.WaitGroup) {
	in.conn.Connect()
	if in.healthService != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in.watchHealth()
		}()
	}
}

// connWatch is the stats handler of an instance's connection: gRPC calls
// HandleConn when a transport to the driver is made (ConnBegin) and when
// it is gone (ConnEnd). The RPC methods do nothing.
type connWatch struct{ in *instance }

func (w connWatch) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (w connWatch) HandleRPC(context.Context, stats.RPCStats)                       {}
func (w connWatch) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (w connWatch) HandleConn(_ context.Context, s stats.ConnStats) {
	in := w.in
	switch s.(type) {
	case *stats.ConnBegin:
		// The socket accepted, but the driver has not answered yet (its
		// HTTP/2 preface): a socket that accepts and never speaks, a
		// wedged driver's, is not a connected driver, and its slices go
		// after the delay as a gone driver's do. awaitReady waits, briefly,
		// for the answer.
		go in.awaitReady(in.transportMade())
	case *stats.ConnEnd:
		in.transportGone()
		if in.ctx.Err() == nil {
			// The channel goes idle when its transport is lost, and
			// would stay so until a call. Connect asks for the driver
			// again at once (with the backoff of connectParams), so a
			// driver that comes back is seen. Not from this goroutine:
			// gRPC may call HandleConn with the lock Connect takes held.
			go in.conn.Connect()
		}
	}
}

// awaitReady waits for the channel to leave CONNECTING after transport
// seq was made: READY means the driver answered on it.
func (in *instance) awaitReady(seq uint64) {
	st := in.conn.GetState()
	for st == connectivity.Connecting && in.conn.WaitForStateChange(in.ctx, st) {
		st = in.conn.GetState()
	}
	if st != connectivity.Ready {
		return
	}
	in.r.mu.Lock()
	defer in.r.mu.Unlock()
	if seq == in.transports {
		// No transport made or gone since: READY is seq's.
		in.setConnectedLocked(true)
	}
}

// transportMade counts a transport made and returns its number.
func (in *instance) transportMade() uint64 {
	in.r.mu.Lock()
	defer in.r.mu.Unlock()
	in.transports++
	return in.transports
}

// transportGone counts a transport gone, which makes what awaitReady
// learns of it stale, and records the driver as not connected.
func (in *instance) transportGone() {
	in.r.mu.Lock()
	defer in.r.mu.Unlock()
	in.transports++
	in.setConnectedLocked(false)
}

// setConnectedLocked records whether the connection is up and brings the
// driver's pending deletion in line with it; called with r.mu held.
func (in *instance) setConnectedLocked(connected bool) {
	r := in.r
	if in.connected == connected {
		return
	}
	in.connected = connected
	in.stateChange = r.now()
	if connected {
		in.lastError = ""
	}
	if in.removed {
		// Closed with its deregistration, which said so.
		r.log.Debug("DRA driver connection closed", "driver", in.driver, "endpoint", in.endpoint)
		return
	}
	r.log.Info("DRA driver connection changed", "driver", in.driver, "endpoint", in.endpoint, "connected", connected)
	r.syncLocked(in.driver)
}

func (in *instance) dialFailed(err error) {
	in.r.mu.Lock()
	in.lastError = bounds.Text(err.Error())
	in.r.mu.Unlock()
}

func (in *instance) close() {
	in.cancel()
	_ = in.conn.Close()
}

// stateLocked returns in's state; called with r.mu held.
func (r *Registry) stateLocked(in *instance) Instance {
	return Instance{
		Driver: in.driver, Endpoint: in.endpoint, SocketPath: in.socketPath, Generation: in.generation,
		OfferedServices: slices.Clone(in.offered), Service: in.service, HealthService: in.healthService,
		Connected: in.connected, State: in.conn.GetState(), Serving: !in.removed && r.servingLocked(in.driver) == in,
		Registered: in.registered, StateChange: in.stateChange, LastError: in.lastError,
	}
}

// Drivers returns every driver with its instances, by name; driver, when
// not empty, keeps only that one.
func (r *Registry) Drivers(driver string) []Driver {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.drivers)+len(r.wipes))
	for n := range r.drivers {
		names = append(names, n)
	}
	for n := range r.wipes {
		if _, ok := r.drivers[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var out []Driver
	for _, n := range names {
		if driver != "" && n != driver {
			continue
		}
		d := Driver{Name: n}
		for _, in := range r.drivers[n] {
			d.Instances = append(d.Instances, r.stateLocked(in))
		}
		if w := r.wipes[n]; w != nil && !w.done {
			d.SliceDeletion = w.at
		}
		out = append(out, d)
	}
	return out
}

// Conn is the connection of a driver's serving instance, for calls to it
// (NodePrepareResources and the like, CallTimeout each).
type Conn struct {
	Driver   string
	Endpoint string
	// Service is v1.DRAPlugin or v1beta1.DRAPlugin: which client to use.
	Service       string
	HealthService string
	*grpc.ClientConn
}

// Serving returns the connection of driver's serving instance: the newest
// connected one, else the newest (its calls then fail as unavailable).
// A driver with no instance is errdefs.ErrNotFound.
func (r *Registry) Serving(driver string) (Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := r.servingLocked(driver)
	if in == nil {
		return Conn{}, fmt.Errorf("DRA driver %s is not registered: %w", bounds.Text(driver), errdefs.ErrNotFound)
	}
	return Conn{Driver: in.driver, Endpoint: in.endpoint, Service: in.service, HealthService: in.healthService, ClientConn: in.conn}, nil
}
