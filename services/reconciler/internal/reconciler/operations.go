package reconciler

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
)

// unregister removes p from the ASW, then tells its handler. The plugin is
// not contacted. A handler error is logged, not returned: the registration
// is gone from the ASW either way, and a downstream that kept it has its
// orphan deregistered later.
func (r *Reconciler) unregister(ctx context.Context, p cache.Plugin) error {
	ctx, span := startSpan(ctx, "reconciler.unregister", r.status.TakeDeleteTrace(p.SocketPath), trace.SpanContext{}, pluginAttrs(p)...)
	defer span.End()
	r.status.Unregistering(p.SocketPath, p.Generation, span.SpanContext().TraceID().String())
	r.asw.Remove(p.SocketPath)
	r.forgotten(p)
	err := step(ctx, "reconciler.handler.Deregister", func(ctx context.Context) error { return p.Handler.Deregister(ctx, p) })
	r.metrics.observeDeregistration(p.Type, err)
	if err != nil {
		span.RecordError(err)
		r.log.WarnContext(ctx, "plugin deregistration: handler failed; retried with the registrations whose sockets are gone", "socket_path", p.SocketPath, "name", p.Name, "error", err)
		r.orphansLater()
		return nil
	}
	r.log.InfoContext(ctx, "plugin deregistered", "socket_path", p.SocketPath, "generation", p.Generation, "type", p.Type, "name", p.Name)
	return nil
}

// registerAgain registers p with its handler again without contacting the
// plugin (its handler's downstream restarted and lost it). On failure the
// plugin leaves the ASW, so after the backoff it goes through the whole
// registration.
func (r *Reconciler) registerAgain(ctx context.Context, p cache.Plugin) error {
	ctx, span := startSpan(ctx, "reconciler.reregister", nil, trace.SpanContext{}, pluginAttrs(p)...)
	r.status.Traced(p.SocketPath, p.Generation, span.SpanContext().TraceID().String())
	start := time.Now()
	err := step(ctx, "reconciler.handler.Register", func(ctx context.Context) error { return p.Handler.Register(ctx, p) })
	r.metrics.observeRegistration(p.Type, err, time.Since(start))
	endSpan(span, err)
	if err != nil && ctx.Err() == nil && !downstreamReady(p) {
		// The handler's peer went away meanwhile: the plugin is not at
		// fault, so it stays registered here and is registered with the
		// peer again once it is back (a restarted peer asks for that
		// too), without contacting the plugin.
		r.markReregister(p.SocketPath)
		r.log.InfoContext(ctx, "registering plugin again failed: its handler's peer is not reachable; retried when it is", "socket_path", p.SocketPath, "name", p.Name, "error", err)
		return nil
	}
	if err != nil {
		r.asw.Remove(p.SocketPath)
		r.forgotten(p)
		if ctx.Err() != nil {
			// Cancelled (its socket went) while the handler worked: it
			// may have registered it all the same.
			r.orphansLater()
		}
		r.status.Failed(p.SocketPath, p.Generation, err, 1, r.clock.Now().Add(executor.Delay(1)))
		r.log.WarnContext(ctx, "registering plugin again failed", "socket_path", p.SocketPath, "name", p.Name, "error", err)
		return err
	}
	r.log.InfoContext(ctx, "plugin registered again", "socket_path", p.SocketPath, "type", p.Type, "name", p.Name)
	return nil
}
