package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/confine"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
)

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
//     then, when the handler waits for its endpoints (cache.EndpointWaiter)
//     and this one does not exist yet, a wait for it without a worker
//     (waitEndpoint);
//  4. addToASW: into the actual state before the handler's Register, so
//     that a socket removed meanwhile is processed as an unregistration;
//  5. handlerRegister: the handler's Register (out of the ASW again when it
//     fails);
//  6. notifyRegistered: NotifyRegistrationStatus(true) (both undone when it
//     fails).
//
// A failure in steps 2 to 5 is told to the plugin (refuse), in the
// kubelet's words (a kubeletrules.Error); a failed GetInfo is not. The
// handler's optional capabilities (package cache) are all this function
// and its steps know of plugin types. beginRegister and endRegister put
// the attempt's span, status, metrics and log around the steps. An error
// makes the executor back off.
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
	prev := r.previous(d)
	if prev != nil {
		defer func() {
			if err != nil {
				r.dropPrevious(context.WithoutCancel(ctx), *prev)
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
		return r.refuse(ctx, conn, p, validationFailed(err))
	}
	r.identified(span, p)
	prevGone, err := r.admit(ctx, a, &p, prev)
	if err != nil {
		return r.refuse(ctx, conn, p, err)
	}
	if err := r.notifyRegistered(ctx, conn, p); err != nil {
		return err
	}
	if prev != nil && !prevGone && replacedElsewhere(*prev, p) {
		r.deregisterPrevious(ctx, *prev)
	}
	r.recorded(p)
	r.status.Registered(d.Path, d.Generation)
	return nil
}

// previous returns the ASW's registration of an earlier generation of d's
// socket, or nil.
func (r *Reconciler) previous(d cache.Socket) *cache.Plugin {
	old, ok := r.asw.Get(d.Path)
	if !ok || old.Generation == d.Generation {
		return nil
	}
	return &old
}

// replacedElsewhere reports whether registering p left old's registration
// in place downstream: its handler changed, or its handler keys
// registrations by what the plugin named (cache.EndpointKeyed) and p's
// does not replace old's. Other handlers key by socket path, so p replaced
// old's.
func replacedElsewhere(old, p cache.Plugin) bool {
	if old.Handler != p.Handler {
		return true
	}
	k, ok := p.Handler.(cache.EndpointKeyed)
	return ok && !k.Replaces(old, p)
}

// dropPrevious forgets old, the registration of an earlier generation of
// its socket, after the attempt to register the new generation failed:
// the old socket is gone, so its registration goes too.
func (r *Reconciler) dropPrevious(ctx context.Context, old cache.Plugin) {
	if cur, ok := r.asw.Get(old.SocketPath); ok && cur.Generation == old.Generation {
		r.asw.Remove(old.SocketPath)
	}
	r.forgotten(old)
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
		return nil, kubeletrules.Wrap(fmt.Sprintf("RegisterPlugin error -- %s at socket %s", msg, socketPath), errors.New(msg))
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
		return validationFailed(err)
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

// waitEndpoint waits, holding no worker (Attempt.Waiting), for an endpoint
// that does not exist yet but may appear inside the allowed directories,
// when p's handler waits for its endpoints (cache.EndpointWaiter: a device
// plugin's, as the kubelet waits for it), for at most
// Options.EndpointWait. The handler's downstream would wait too, while
// this attempt held its worker; waiting here keeps the worker free for
// other sockets (DESIGN "Dialling a new socket") and ends with the attempt
// when its socket goes. An endpoint that does not appear fails the
// registration with the handler's EndpointMissing.
func (r *Reconciler) waitEndpoint(ctx context.Context, a executor.Attempt, p cache.Plugin) error {
	w, waits := p.Handler.(cache.EndpointWaiter)
	c := r.opts.Confiner
	if !waits || c == nil || !confine.MayAppear(c, p.Endpoint) {
		return nil
	}
	r.log.InfoContext(ctx, "plugin endpoint does not exist yet; waiting for it", "socket_path", p.SocketPath, "type", p.Type, "endpoint", p.Endpoint, "wait", r.opts.EndpointWait)
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
		return registrationFailed(w.EndpointMissing(p.Endpoint, r.opts.EndpointWait))
	}
	return validationFailed(err)
}

// addToASW (step 4) records the plugin as registered.
func (r *Reconciler) addToASW(p cache.Plugin) error {
	if err := r.asw.Add(p); err != nil {
		err = fmt.Errorf("recording the plugin failed: %w", err)
		return kubeletrules.Wrap("RegisterPlugin error -- "+err.Error(), err)
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
		return prevGone, registrationFailed(err)
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
// words (kubeletrules.Told), and returns the refusal with nodeplug's
// detail (the plugin, the socket, the failed step and its cause) for
// ListPlugins and the logs, and the notification's failure, if any.
func (r *Reconciler) refuse(ctx context.Context, conn *pluginConn, p cache.Plugin, cause error) error {
	return r.notify(ctx, conn, kubeletrules.Told(cause), refusal(p, cause))
}

// validationFailed is a failed validation (steps 1 and 3) as the kubelet
// tells it to the plugin, with nodeplug's detail.
func validationFailed(err error) error {
	return kubeletrules.Wrap("RegisterPlugin error -- plugin validation failed with err: "+kubeletrules.Told(err), fmt.Errorf("plugin validation failed: %w", err))
}

// registrationFailed is a failed handler registration (step 5) as the
// kubelet tells it to the plugin: the handler's kubelet words when its
// error carries them (a kubeletrules.Error), with nodeplug's detail.
func registrationFailed(err error) error {
	return kubeletrules.Wrap("RegisterPlugin error -- plugin registration failed with err: "+kubeletrules.Told(err), fmt.Errorf("plugin registration failed: %w", err))
}

// refusal is the detailed reason a plugin was not registered, as
// nodeplug's own API reports it.
func refusal(p cache.Plugin, cause error) error {
	return fmt.Errorf("RegisterPlugin error -- plugin %q (type %q) at socket %s: %w", p.Name, p.Type, p.SocketPath, cause)
}
