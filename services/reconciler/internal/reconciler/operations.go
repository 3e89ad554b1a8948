package reconciler

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
)

var tracer = telemetry.Tracer("github.com/nodeplug/nodeplug/services/reconciler")

// connectParams make a refused connection (fsnotify reports a socket at
// bind(), before listen()) be retried within milliseconds, inside the
// GetInfo budget, instead of after gRPC's default second.
var connectParams = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  2 * time.Millisecond,
		Multiplier: 2,
		Jitter:     0.2,
		MaxDelay:   50 * time.Millisecond,
	},
	MinConnectTimeout: time.Second,
}

// startSpan starts an operation's span: a child of the event's trace on the
// first attempt of a live event, else a new root; a retry links to the first
// attempt.
func startSpan(ctx context.Context, name string, carrier map[string]string, link trace.SpanContext, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithAttributes(attrs...)}
	if link.IsValid() {
		opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: link, Attributes: []attribute.KeyValue{attribute.String("nodeplug.link", "first_attempt")}}))
	} else if len(carrier) > 0 {
		ctx = telemetry.Extract(ctx, carrier)
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	return tracer.Start(ctx, name, opts...)
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// step runs f in a child span named name.
func step(ctx context.Context, name string, f func(ctx context.Context) error) error {
	ctx, span := tracer.Start(ctx, name)
	err := f(ctx)
	endSpan(span, err)
	return err
}

func (r *Reconciler) registerOp(d cache.Socket) executor.Op {
	return func(ctx context.Context, a executor.Attempt) (err error) {
		var carrier map[string]string
		var link trace.SpanContext
		if a.Failures == 0 {
			carrier = d.TraceContext
		} else if st, ok := r.Plugin(d.Path); ok {
			link = st.firstSpan
		}
		ctx, span := startSpan(ctx, "reconciler.register", carrier, link,
			attribute.String("nodeplug.socket_path", d.Path),
			attribute.String("nodeplug.generation", d.Generation),
			attribute.Int("nodeplug.attempt", a.Failures+1))
		sc := span.SpanContext()
		r.update(d.Path, d.Generation, func(s *PluginStatus) {
			s.State = StatePending
			s.LastTraceID = sc.TraceID().String()
			if a.Failures == 0 {
				s.firstSpan = sc
			}
		})
		start := time.Now()
		typ := ""
		defer func() {
			endSpan(span, err)
			r.metrics.observeRegistration(typ, err, time.Since(start))
			if err != nil {
				failures := a.Failures + 1
				next := r.clock.Now().Add(executor.Delay(failures))
				r.update(d.Path, d.Generation, func(s *PluginStatus) {
					s.State = StateFailed
					s.LastError = err.Error()
					s.Failures = failures
					s.NextRetry = next
				})
				r.log.WarnContext(ctx, "plugin registration failed", "socket_path", d.Path, "generation", d.Generation, "failures", failures, "next_retry", next, "error", err)
				return
			}
			r.log.InfoContext(ctx, "plugin registered", "socket_path", d.Path, "generation", d.Generation, "type", typ, "duration", time.Since(start))
		}()
		info, client, closeConn, err := r.getInfo(ctx, d.Path)
		if err != nil {
			return err
		}
		defer closeConn()
		typ = info.GetType()
		plugin := cache.Plugin{
			SocketPath: d.Path,
			Generation: d.Generation,
			Type:       info.GetType(),
			Name:       info.GetName(),
			Endpoint:   info.GetEndpoint(),
			Versions:   info.GetSupportedVersions(),
		}
		if plugin.Endpoint == "" {
			plugin.Endpoint = d.Path
		}
		span.SetAttributes(attribute.String("nodeplug.plugin.type", plugin.Type), attribute.String("nodeplug.plugin.name", plugin.Name), attribute.String("nodeplug.plugin.endpoint", plugin.Endpoint))
		r.update(d.Path, d.Generation, func(s *PluginStatus) {
			s.Name, s.Type, s.Endpoint, s.Versions = plugin.Name, plugin.Type, plugin.Endpoint, plugin.Versions
		})
		fail := func(what string, cause error) error {
			reason := fmt.Sprintf("RegisterPlugin error -- plugin %q (type %q) at socket %s: %s", plugin.Name, plugin.Type, d.Path, what)
			if cause != nil {
				reason += ": " + cause.Error()
			}
			return r.notify(ctx, client, d.Path, false, reason)
		}

		h := r.handlers[plugin.Type]
		if h == nil {
			return fail(fmt.Sprintf("no handler registered for plugin type: %s", plugin.Type), nil)
		}
		plugin.Handler = h
		if err := step(ctx, "reconciler.Validate", func(ctx context.Context) error {
			if err := r.checkEndpoint(plugin.Endpoint); err != nil {
				return err
			}
			return h.Validate(ctx, plugin.Name, plugin.Endpoint, plugin.Versions)
		}); err != nil {
			return fail("plugin validation failed", err)
		}
		// Into the ASW before the handler's Register, so that a socket
		// removed meanwhile is processed as an unregistration.
		if err := r.asw.Add(plugin); err != nil {
			return fail("recording the plugin failed", err)
		}
		if err := step(ctx, "reconciler.handler.Register", func(ctx context.Context) error { return h.Register(ctx, plugin) }); err != nil {
			r.asw.Remove(d.Path)
			return fail("plugin registration failed", err)
		}
		if err := r.notify(ctx, client, d.Path, true, ""); err != nil {
			r.asw.Remove(d.Path)
			if derr := h.Deregister(ctx, plugin); derr != nil {
				r.log.WarnContext(ctx, "deregistering after a failed notification", "socket_path", d.Path, "error", derr)
			}
			return fmt.Errorf("RegisterPlugin error -- plugin %q at socket %s: %w", plugin.Name, d.Path, err)
		}
		r.update(d.Path, d.Generation, func(s *PluginStatus) {
			s.State = StateRegistered
			s.LastError = ""
			s.Failures = 0
			s.NextRetry = time.Time{}
			s.firstSpan = trace.SpanContext{}
		})
		return nil
	}
}

// checkEndpoint confines a plugin's endpoint to the allowed directories.
// An endpoint that does not exist yet is judged by its path alone (the
// handler that dials it fails later if it never appears); one that exists
// must resolve, symlinks followed, inside the allowed directories.
func (r *Reconciler) checkEndpoint(endpoint string) error {
	c := r.opts.Confiner
	if c == nil {
		return nil
	}
	_, err := c.Resolve(endpoint)
	if err != nil && filepath.IsAbs(endpoint) && !slices.Contains(strings.Split(endpoint, "/"), "..") && c.Within(filepath.Clean(endpoint)) {
		if _, serr := os.Lstat(endpoint); errors.Is(serr, fs.ErrNotExist) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("endpoint %s is not allowed: %w", endpoint, err)
	}
	return nil
}

// getInfo dials the plugin and calls GetInfo within the GetInfo budget. A
// refused connection is retried by gRPC within milliseconds inside that
// budget (WaitForReady), so a socket reported at bind() before listen() is
// not a failure.
func (r *Reconciler) getInfo(ctx context.Context, path string) (*registerapi.PluginInfo, registerapi.RegistrationClient, func(), error) {
	var info *registerapi.PluginInfo
	var client registerapi.RegistrationClient
	var conn *grpc.ClientConn
	err := step(ctx, "reconciler.GetInfo", func(ctx context.Context) error {
		var err error
		conn, err = rpcutil.DialPlugin(path, grpc.WithConnectParams(connectParams))
		if err != nil {
			return fmt.Errorf("RegisterPlugin error -- dial failed at socket %s, err: %w", path, err)
		}
		client = registerapi.NewRegistrationClient(conn)
		gctx, cancel := context.WithTimeout(ctx, r.opts.GetInfoTimeout)
		defer cancel()
		info, err = client.GetInfo(gctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
		if err != nil {
			_ = conn.Close()
			return fmt.Errorf("RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket %s, err: %w", path, errdefs.FromGRPC(err))
		}
		return nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return info, client, func() { _ = conn.Close() }, nil
}

// notify sends NotifyRegistrationStatus. A failure report always returns an
// error (the operation failed), as does a failed RPC.
func (r *Reconciler) notify(ctx context.Context, client registerapi.RegistrationClient, path string, registered bool, reason string) error {
	return step(ctx, "reconciler.NotifyRegistrationStatus", func(ctx context.Context) error {
		trace.SpanFromContext(ctx).SetAttributes(attribute.Bool("nodeplug.registered", registered))
		nctx, cancel := context.WithTimeout(ctx, r.opts.NotifyTimeout)
		defer cancel()
		_, err := client.NotifyRegistrationStatus(nctx, &registerapi.RegistrationStatus{PluginRegistered: registered, Error: reason})
		switch {
		case err != nil && reason != "":
			return fmt.Errorf("%s; and telling the plugin failed: %w", reason, errdefs.FromGRPC(err))
		case err != nil:
			return fmt.Errorf("failed to send registration status at socket %s: %w", path, errdefs.FromGRPC(err))
		case reason != "":
			return errors.New(reason)
		}
		return nil
	})
}

// unregisterOp removes p from the ASW, then tells its handler. The plugin
// is not contacted. A handler error is logged: the registration is gone
// from the ASW either way, and a downstream that kept it is swept later.
func (r *Reconciler) unregisterOp(p cache.Plugin) executor.Op {
	return func(ctx context.Context, _ executor.Attempt) error {
		r.mu.Lock()
		carrier := r.deleteTrace[p.SocketPath]
		delete(r.deleteTrace, p.SocketPath)
		r.mu.Unlock()
		ctx, span := startSpan(ctx, "reconciler.unregister", carrier, trace.SpanContext{},
			attribute.String("nodeplug.socket_path", p.SocketPath),
			attribute.String("nodeplug.generation", p.Generation),
			attribute.String("nodeplug.plugin.type", p.Type),
			attribute.String("nodeplug.plugin.name", p.Name))
		defer span.End()
		tid := span.SpanContext().TraceID().String()
		r.update(p.SocketPath, p.Generation, func(s *PluginStatus) { s.State = StatePending; s.LastTraceID = tid })
		r.asw.Remove(p.SocketPath)
		err := step(ctx, "reconciler.handler.Deregister", func(ctx context.Context) error { return p.Handler.Deregister(ctx, p) })
		r.metrics.observeDeregistration(p.Type, err)
		if err != nil {
			span.RecordError(err)
			r.log.WarnContext(ctx, "plugin deregistration: handler failed; a sweep will retry", "socket_path", p.SocketPath, "name", p.Name, "error", err)
			r.mu.Lock()
			r.needSweep = true
			r.mu.Unlock()
		} else {
			r.log.InfoContext(ctx, "plugin deregistered", "socket_path", p.SocketPath, "generation", p.Generation, "type", p.Type, "name", p.Name)
		}
		return nil
	}
}

// reregisterOp registers p with its handler again without contacting the
// plugin. On failure the plugin leaves the ASW, so after the backoff it goes
// through the whole registration.
func (r *Reconciler) reregisterOp(p cache.Plugin) executor.Op {
	return func(ctx context.Context, _ executor.Attempt) error {
		ctx, span := startSpan(ctx, "reconciler.reregister", nil, trace.SpanContext{},
			attribute.String("nodeplug.socket_path", p.SocketPath),
			attribute.String("nodeplug.generation", p.Generation),
			attribute.String("nodeplug.plugin.type", p.Type),
			attribute.String("nodeplug.plugin.name", p.Name))
		tid := span.SpanContext().TraceID().String()
		r.update(p.SocketPath, p.Generation, func(s *PluginStatus) { s.LastTraceID = tid })
		start := time.Now()
		err := step(ctx, "reconciler.handler.Register", func(ctx context.Context) error { return p.Handler.Register(ctx, p) })
		r.metrics.observeRegistration(p.Type, err, time.Since(start))
		endSpan(span, err)
		if err != nil {
			r.asw.Remove(p.SocketPath)
			next := r.clock.Now().Add(executor.Delay(1))
			r.update(p.SocketPath, p.Generation, func(s *PluginStatus) {
				s.State = StateFailed
				s.LastError = err.Error()
				s.Failures = 1
				s.NextRetry = next
			})
			r.log.WarnContext(ctx, "registering plugin again failed", "socket_path", p.SocketPath, "name", p.Name, "error", err)
			return err
		}
		r.log.InfoContext(ctx, "plugin registered again", "socket_path", p.SocketPath, "type", p.Type, "name", p.Name)
		return nil
	}
}
