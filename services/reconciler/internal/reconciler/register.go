package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/confine"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
)

// connectParams make gRPC's own reconnection quick; the refused
// connections of the bind→listen gap are retried by dialListening.
var connectParams = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  2 * time.Millisecond,
		Multiplier: 2,
		Jitter:     0.2,
		MaxDelay:   50 * time.Millisecond,
	},
	MinConnectTimeout: time.Second,
}

// register is one attempt at the kubelet's register sequence for the socket
// d (pluginmanager operationexecutor, GenerateRegisterPluginFunc), one
// function per step:
//
//  1. getInfo: dial the socket and call GetInfo within its budget; the
//     answer is held to DESIGN "Bounds" (checkInfo) before any of it is
//     recorded, and a plugin that fails them is refused like one that
//     fails validation;
//  2. pickHandler: the handler of the plugin's type;
//  3. validate: the endpoint's confinement, then the handler's Validate;
//     then, for a device plugin whose endpoint does not exist yet, a wait
//     for it without a worker (waitEndpoint);
//  4. addToASW: into the actual state before the handler's Register, so
//     that a socket removed meanwhile is processed as an unregistration;
//  5. handlerRegister: the handler's Register (out of the ASW again when it
//     fails);
//  6. notifyRegistered: NotifyRegistrationStatus(true) (both undone when it
//     fails).
//
// A failure in steps 2 to 5 is told to the plugin (refuse); a failed GetInfo
// is not. beginRegister and endRegister put the attempt's span, status,
// metrics and log around the steps. An error makes the executor back off.
func (r *Reconciler) register(ctx context.Context, d cache.Socket, a executor.Attempt) (err error) {
	ctx, span := r.beginRegister(ctx, d, a)
	start := time.Now()
	var p cache.Plugin
	defer func() { r.endRegister(ctx, span, d, a, p.Type, time.Since(start), err) }()

	// A registration of an earlier generation of this socket (recreated
	// while registered) stays in place while this attempt runs, so that a
	// plugin whose endpoint keeps serving is replaced downstream without a
	// dip (DESIGN "Restarts without a dip"). It is deregistered only when
	// this attempt fails, or when what it named changed.
	old, hasOld := r.asw.Get(d.Path)
	hasOld = hasOld && old.Generation != d.Generation
	if hasOld {
		defer func() {
			if err != nil {
				r.dropPrevious(context.WithoutCancel(ctx), old)
			}
		}()
	}

	p, conn, err := r.getInfo(ctx, d, a)
	if err != nil {
		return err
	}
	defer conn.close()
	if err := checkInfo(p); err != nil {
		// Nothing the plugin said is recorded or echoed beyond its bounds.
		p = clipped(p)
		r.identified(span, p)
		return r.refuse(ctx, conn, p, refused("RegisterPlugin error -- plugin validation failed with err: "+plain(err), fmt.Errorf("plugin validation failed: %w", err)))
	}
	r.identified(span, p)
	var prev *cache.Plugin
	if hasOld {
		prev = &old
	}
	prevGone, err := r.admit(ctx, a, &p, prev)
	if err != nil {
		return r.refuse(ctx, conn, p, err)
	}
	if err := r.notifyRegistered(ctx, conn, p); err != nil {
		return err
	}
	if hasOld && !prevGone && replacedElsewhere(old, p) {
		r.deregisterPrevious(ctx, old)
	}
	r.status.Registered(d.Path, d.Generation)
	return nil
}

// replacedElsewhere reports whether registering p left old's registration
// in place downstream: its handler changed, or (for device plugins, which
// the devicemanager keys by endpoint and resource) its name or endpoint did.
// CSI and DRA records are keyed by socket path, so p replaced old's.
func replacedElsewhere(old, p cache.Plugin) bool {
	if old.Handler != p.Handler {
		return true
	}
	return p.Type == handlerTypeDevicePlugin && (old.Name != p.Name || old.Endpoint != p.Endpoint)
}

// handlerTypeDevicePlugin is the plugin type whose registrations live in
// the devicemanager, keyed by endpoint.
const handlerTypeDevicePlugin = "DevicePlugin"

// dropPrevious forgets old, the registration of an earlier generation of
// its socket, after the attempt to register the new generation failed:
// the old socket is gone, so its registration goes too.
func (r *Reconciler) dropPrevious(ctx context.Context, old cache.Plugin) {
	if cur, ok := r.asw.Get(old.SocketPath); ok && cur.Generation == old.Generation {
		r.asw.Remove(old.SocketPath)
	}
	r.deregisterPrevious(ctx, old)
}

// deregisterPrevious tells old's handler that the registration of an
// earlier generation of the socket is gone. A failure is retried with the
// registrations whose sockets are gone.
func (r *Reconciler) deregisterPrevious(ctx context.Context, old cache.Plugin) {
	err := step(ctx, "reconciler.handler.Deregister", func(ctx context.Context) error { return old.Handler.Deregister(ctx, old) })
	r.metrics.observeDeregistration(old.Type, err)
	if err != nil {
		r.log.WarnContext(ctx, "deregistering the socket's previous registration failed; retried with the registrations whose sockets are gone", "socket_path", old.SocketPath, "generation", old.Generation, "name", old.Name, "error", err)
		r.orphansLater()
		return
	}
	r.log.InfoContext(ctx, "previous registration of a recreated socket deregistered", "socket_path", old.SocketPath, "generation", old.Generation, "name", old.Name, "endpoint", old.Endpoint)
}

// admit runs steps 2 to 5: after it returns nil the plugin is registered
// with its handler and recorded in the ASW; after an error, neither. prev,
// when set, is the registration of an earlier generation of the socket;
// prevGone reports that it was deregistered on the way.
func (r *Reconciler) admit(ctx context.Context, a executor.Attempt, p *cache.Plugin, prev *cache.Plugin) (prevGone bool, err error) {
	h, err := r.pickHandler(p.Type, p.SocketPath)
	if err != nil {
		return false, err
	}
	p.Handler = h
	if err := r.validate(ctx, *p); err != nil {
		return false, err
	}
	if err := r.waitEndpoint(ctx, a, *p); err != nil {
		return false, err
	}
	if err := r.addToASW(*p); err != nil {
		return false, err
	}
	return r.handlerRegister(ctx, *p, prev)
}

// beginRegister starts the attempt's span, continuing the event's trace on
// a first attempt and linking a retry to the first attempt, and marks the
// socket pending with that trace.
func (r *Reconciler) beginRegister(ctx context.Context, d cache.Socket, a executor.Attempt) (context.Context, trace.Span) {
	var carrier map[string]string
	var link trace.SpanContext
	if a.Failures == 0 {
		carrier = d.TraceContext
	} else {
		link = r.status.FirstAttempt(d.Path)
	}
	ctx, span := startSpan(ctx, "reconciler.register", carrier, link,
		attribute.String("nodeplug.socket_path", d.Path),
		attribute.String("nodeplug.generation", d.Generation),
		attribute.Int("nodeplug.attempt", a.Failures+1))
	r.status.Attempting(d.Path, d.Generation, span.SpanContext(), a.Failures == 0)
	return ctx, span
}

// endRegister ends the attempt's span, counts it, and records and logs a
// failure with the time of the next attempt, or logs the success.
func (r *Reconciler) endRegister(ctx context.Context, span trace.Span, d cache.Socket, a executor.Attempt, typ string, took time.Duration, err error) {
	endSpan(span, err)
	r.metrics.observeRegistration(typ, err, took)
	if err != nil {
		failures := a.Failures + 1
		next := r.clock.Now().Add(executor.Delay(failures))
		if cause := context.Cause(ctx); errors.Is(cause, errSocketGone) {
			err = fmt.Errorf("%w: %w", cause, err)
			r.status.Failed(d.Path, d.Generation, err, failures, next)
			r.log.InfoContext(ctx, "plugin registration cancelled", "socket_path", d.Path, "generation", d.Generation, "error", err)
			return
		}
		r.status.Failed(d.Path, d.Generation, err, failures, next)
		r.log.WarnContext(ctx, "plugin registration failed", "socket_path", d.Path, "generation", d.Generation, "failures", failures, "next_retry", next, "error", err)
		return
	}
	r.log.InfoContext(ctx, "plugin registered", "socket_path", d.Path, "generation", d.Generation, "type", typ, "duration", took)
}

// pluginConn is the connection to a plugin's registration socket for one
// attempt.
type pluginConn struct {
	path   string
	conn   *grpc.ClientConn
	client registerapi.RegistrationClient
}

func (c *pluginConn) close() { _ = c.conn.Close() }

// getInfo (step 1) dials the plugin and calls GetInfo within the GetInfo
// budget (Options.GetInfoTimeout on the reconciler's clock). A refused
// connection is redialled within milliseconds for Options.RefusedWindow
// (dialListening), so a socket reported at bind() before listen() is not a
// failure, and a stale one fails fast; a retry, which comes a backoff
// later, connects once. That first connect holds no worker
// (Attempt.Waiting): the stale sockets being retried never keep a healthy
// plugin's registration waiting for one (DESIGN "Stale sockets"). The
// plugin's endpoint defaults to its socket.
func (r *Reconciler) getInfo(ctx context.Context, d cache.Socket, a executor.Attempt) (cache.Plugin, *pluginConn, error) {
	var info *registerapi.PluginInfo
	c := &pluginConn{path: d.Path}
	err := step(ctx, "reconciler.GetInfo", func(ctx context.Context) error {
		// Only a first attempt can meet the bind→listen gap: a retry
		// comes at least a backoff later, so one refused connect fails it.
		window := r.opts.RefusedWindow
		if a.Failures > 0 {
			window = 0
		}
		dial := dialListening(r.opts.Confiner, d.Path, window)
		// Connect once first, without a worker: a socket that only
		// refuses (stale) fails here, within the refused window. The
		// connection made is the one gRPC uses first.
		var first net.Conn
		err := a.Waiting(ctx, func(ctx context.Context) (err error) {
			first, err = dial(ctx, d.Path)
			return err
		})
		if err != nil {
			if first != nil {
				_ = first.Close()
			}
			return fmt.Errorf("RegisterPlugin error -- dial failed at socket %s, err: %w", d.Path, errdefs.FromGRPC(err))
		}
		c.conn, err = rpcutil.DialPlugin(d.Path, grpc.WithConnectParams(connectParams), grpc.WithContextDialer(handOver(first, dial)))
		if err != nil {
			_ = first.Close()
			return fmt.Errorf("RegisterPlugin error -- dial failed at socket %s, err: %w", d.Path, err)
		}
		c.client = registerapi.NewRegistrationClient(c.conn)
		// The budget runs on the reconciler's clock, as its backoff does.
		gctx, cancel := r.clock.WithTimeout(ctx, r.opts.GetInfoTimeout)
		defer cancel()
		// WaitForReady: the plugin listens (it accepted above), so a
		// handshake slowed by a busy machine, or a transport that had to
		// reconnect, is waited for within the budget rather than failed.
		info, err = c.client.GetInfo(gctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
		if err != nil {
			c.close()
			if errors.Is(context.Cause(gctx), context.DeadlineExceeded) && ctx.Err() == nil {
				err = fmt.Errorf("no answer within %s: %w", r.opts.GetInfoTimeout, errdefs.ErrDeadlineExceeded)
			} else {
				err = errdefs.FromGRPC(err)
			}
			return fmt.Errorf("RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket %s, err: %w", d.Path, err)
		}
		return nil
	})
	if err != nil {
		return cache.Plugin{}, nil, err
	}
	p := cache.Plugin{
		SocketPath: d.Path,
		Generation: d.Generation,
		Type:       info.GetType(),
		Name:       info.GetName(),
		Endpoint:   info.GetEndpoint(),
		Versions:   info.GetSupportedVersions(),
	}
	if p.Endpoint == "" {
		p.Endpoint = d.Path
	}
	return p, c, nil
}

// identified records what GetInfo said, on the span and in the status.
func (r *Reconciler) identified(span trace.Span, p cache.Plugin) {
	span.SetAttributes(attribute.String("nodeplug.plugin.type", p.Type), attribute.String("nodeplug.plugin.name", p.Name), attribute.String("nodeplug.plugin.endpoint", p.Endpoint))
	r.status.Identified(p.SocketPath, p.Generation, p.Name, p.Type, p.Endpoint, p.Versions)
}

// pickHandler (step 2) returns the handler of plugin type typ.
func (r *Reconciler) pickHandler(typ, socketPath string) (cache.Handler, error) {
	h := r.handlers[typ]
	if h == nil {
		msg := fmt.Sprintf("no handler registered for plugin type: %s", typ)
		return nil, refused(fmt.Sprintf("RegisterPlugin error -- %s at socket %s", msg, socketPath), errors.New(msg))
	}
	return h, nil
}

// validate (step 3) confines the plugin's endpoint, then asks its handler.
func (r *Reconciler) validate(ctx context.Context, p cache.Plugin) error {
	err := step(ctx, "reconciler.Validate", func(ctx context.Context) error {
		if err := r.checkEndpoint(p.Endpoint); err != nil {
			return err
		}
		return p.Handler.Validate(ctx, p.Name, p.Endpoint, p.Versions)
	})
	if err != nil {
		return refused("RegisterPlugin error -- plugin validation failed with err: "+plain(err), fmt.Errorf("plugin validation failed: %w", err))
	}
	return nil
}

// checkEndpoint confines a plugin's endpoint to the allowed directories
// (confine.Check): one that exists must resolve, symlinks followed, inside
// them; one that does not exist yet must be able to appear only inside
// them. Handlers that dial the endpoint check it again when they dial.
func (r *Reconciler) checkEndpoint(endpoint string) error {
	return confine.Check(r.opts.Confiner, endpoint)
}

// waitEndpoint waits, holding no worker (Attempt.Waiting), for a device
// plugin's endpoint that does not exist yet but may appear inside the
// allowed directories, as the kubelet waits for it, for at most
// Options.EndpointWait. The devicemanager would wait too, while this
// attempt held its worker; waiting here keeps the worker free for other
// sockets (DESIGN "Dialling a new socket") and ends with the attempt when
// its socket goes. An endpoint that does not appear fails the registration
// with the kubelet's words.
func (r *Reconciler) waitEndpoint(ctx context.Context, a executor.Attempt, p cache.Plugin) error {
	c := r.opts.Confiner
	if p.Type != handlerTypeDevicePlugin || c == nil || !confine.MayAppear(c, p.Endpoint) {
		return nil
	}
	r.log.InfoContext(ctx, "device plugin endpoint does not exist yet; waiting for it", "socket_path", p.SocketPath, "endpoint", p.Endpoint, "wait", r.opts.EndpointWait)
	err := a.Waiting(ctx, func(ctx context.Context) error {
		wctx, cancel := context.WithTimeout(ctx, r.opts.EndpointWait)
		defer cancel()
		_, err := confine.Resolve(wctx, c, p.Endpoint)
		return err
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return err
	case errors.Is(err, errdefs.ErrUnavailable):
		return refused("RegisterPlugin error -- plugin registration failed with err: failed to dial device plugin: "+context.DeadlineExceeded.Error(),
			fmt.Errorf("plugin registration failed: device plugin endpoint %s did not appear within %v: %w", p.Endpoint, r.opts.EndpointWait, errdefs.ErrUnavailable))
	}
	return refused("RegisterPlugin error -- plugin validation failed with err: "+plain(err), fmt.Errorf("plugin validation failed: %w", err))
}

// addToASW (step 4) records the plugin as registered.
func (r *Reconciler) addToASW(p cache.Plugin) error {
	if err := r.asw.Add(p); err != nil {
		err = fmt.Errorf("recording the plugin failed: %w", err)
		return refused("RegisterPlugin error -- "+err.Error(), err)
	}
	return nil
}

// handlerRegister (step 5) registers the plugin with its handler; on
// failure it leaves the ASW again. When the handler refuses p because
// prev, the socket's previous registration, still holds its endpoint
// (ALREADY_EXISTS: a resource renamed on the same endpoint), prev is
// deregistered (prevGone) and p registered again.
func (r *Reconciler) handlerRegister(ctx context.Context, p cache.Plugin, prev *cache.Plugin) (prevGone bool, err error) {
	reg := func() error {
		return step(ctx, "reconciler.handler.Register", func(ctx context.Context) error { return p.Handler.Register(ctx, p) })
	}
	err = reg()
	if err != nil && prev != nil && errors.Is(err, errdefs.ErrAlreadyExists) && prev.Handler == p.Handler && prev.Endpoint == p.Endpoint {
		r.deregisterPrevious(ctx, *prev)
		prevGone = true
		err = reg()
	}
	if err != nil {
		r.asw.Remove(p.SocketPath)
		if ctx.Err() != nil {
			// Cancelled (its socket went) while the handler worked: the
			// handler may have registered it all the same, so look for
			// registrations whose sockets are gone.
			r.orphansLater()
		}
		msg := plain(err)
		var kw interface{ KubeletMessage() string }
		if errors.As(err, &kw) {
			msg = kw.KubeletMessage()
		}
		return prevGone, refused("RegisterPlugin error -- plugin registration failed with err: "+msg, fmt.Errorf("plugin registration failed: %w", err))
	}
	return prevGone, nil
}

// notifyRegistered (step 6) tells the plugin it is registered. When that
// fails, the registration is undone (ASW and handler) so that the retry
// starts over.
func (r *Reconciler) notifyRegistered(ctx context.Context, conn *pluginConn, p cache.Plugin) error {
	err := r.notify(ctx, conn, "", nil)
	if err == nil {
		return nil
	}
	r.asw.Remove(p.SocketPath)
	// The attempt's context may have been cancelled (its socket went):
	// the undoing must still reach the handler.
	if derr := p.Handler.Deregister(context.WithoutCancel(ctx), p); derr != nil {
		r.log.WarnContext(ctx, "deregistering after a failed notification; retried with the registrations whose sockets are gone", "socket_path", p.SocketPath, "error", derr)
		r.orphansLater()
	}
	return fmt.Errorf("RegisterPlugin error -- plugin %q at socket %s: %w", p.Name, p.SocketPath, err)
}

// refuse tells the plugin why it was not registered, in the kubelet's
// words (refusedError.kubelet; the cause's own text when it has none), and
// returns the refusal with nodeplug's detail (the plugin, the socket, the
// failed step and its cause) for ListPlugins and the logs, and the
// notification's failure, if any.
func (r *Reconciler) refuse(ctx context.Context, conn *pluginConn, p cache.Plugin, cause error) error {
	told := cause.Error()
	var re *refusedError
	if errors.As(cause, &re) {
		told = re.kubelet
	}
	return r.notify(ctx, conn, told, refusal(p, cause))
}

// refusedError is a failed step's error with what the kubelet tells the
// plugin for it (pkg/kubelet/pluginmanager/operationexecutor).
type refusedError struct {
	kubelet string
	err     error
}

func refused(kubelet string, err error) error { return &refusedError{kubelet: kubelet, err: err} }

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// plain is err's text without the trailing ": <kind>" of the errdefs
// sentinel it wraps: the kubelet's messages have no such suffix.
func plain(err error) string {
	msg := err.Error()
	for _, kind := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrFailedPrecondition,
		errdefs.ErrUnavailable, errdefs.ErrResourceExhausted, errdefs.ErrInternal, errdefs.ErrDeadlineExceeded} {
		if suffix := ": " + kind.Error(); errors.Is(err, kind) && strings.HasSuffix(msg, suffix) {
			return strings.TrimSuffix(msg, suffix)
		}
	}
	return msg
}

// refusal is the detailed reason a plugin was not registered, as
// nodeplug's own API reports it.
func refusal(p cache.Plugin, cause error) error {
	return fmt.Errorf("RegisterPlugin error -- plugin %q (type %q) at socket %s: %w", p.Name, p.Type, p.SocketPath, cause)
}

// notify sends NotifyRegistrationStatus: registered when refusal is nil,
// else not registered with told as the reason. It returns refusal, the
// RPC's failure, or both.
func (r *Reconciler) notify(ctx context.Context, conn *pluginConn, told string, refusal error) error {
	return step(ctx, "reconciler.NotifyRegistrationStatus", func(ctx context.Context) error {
		registered := refusal == nil
		trace.SpanFromContext(ctx).SetAttributes(attribute.Bool("nodeplug.registered", registered))
		req := &registerapi.RegistrationStatus{PluginRegistered: registered}
		if !registered {
			// A proto string: the reason may echo a socket path that is not UTF-8.
			req.Error = bounds.Text(told)
		}
		nctx, cancel := context.WithTimeout(ctx, r.opts.NotifyTimeout)
		defer cancel()
		_, err := conn.client.NotifyRegistrationStatus(nctx, req)
		switch {
		case err != nil && !registered:
			return fmt.Errorf("%w; and telling the plugin failed: %w", refusal, errdefs.FromGRPC(err))
		case err != nil:
			return fmt.Errorf("failed to send registration status at socket %s: %w", conn.path, errdefs.FromGRPC(err))
		}
		return refusal
	})
}
