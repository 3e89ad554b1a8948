package telemetry

import (
	"context"
	"net"
	"reflect"
	"strings"
	"sync"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc/stats"

	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// The gRPC stats handlers that trace calls, with the right server.address
// on Unix sockets.
//
// The kernel names a Unix connection's server end by the name its socket
// was bound with, which need not be the path it is reached at: pkg/unixsock
// binds every socket in a private directory beside its path and renames it
// into place, so otelgrpc, which takes server.address from the
// connection's addresses, would name a temporary path
// (<dir>/.s3022539149/s) that no longer exists. These handlers put the path
// dialled (client side) and the path served (server side) in its place.

// ClientHandler returns the tracing stats handler of a client connection to
// addr; health checks are not traced. When addr is a Unix socket path, the
// spans' server.address is addr, the path dialled.
//
// The otelgrpc handler underneath is shared by every connection: building
// one makes its tracer and metric instruments, which in a burst of plugin
// dials cost more than the rest of a connection's setup. It is built again
// when the process's OTel providers or propagator change (see shared).
func ClientHandler(addr string) stats.Handler {
	h := clientHandlers.get()
	if !strings.HasPrefix(addr, "/") {
		return h
	}
	return &dialledHandler{Handler: h, addr: &net.UnixAddr{Name: addr, Net: "unix"}}
}

// clientHandlers is the otelgrpc client handler of the current global
// providers and propagator.
var clientHandlers = shared{build: func() stats.Handler {
	return otelgrpc.NewClientHandler(otelgrpc.WithFilter(filters.Not(filters.HealthCheck())))
}}

// shared keeps one handler built for the global tracer provider, meter
// provider and propagator it was built with. A process sets them once,
// before it dials; tests set them in TestMain, or more than once, and
// each setting is honoured from the next connection on.
type shared struct {
	build func() stats.Handler

	mu     sync.Mutex
	h      stats.Handler
	tp, mp any
	prop   any
}

func (s *shared) get() stats.Handler {
	tp, mp, prop := otel.GetTracerProvider(), otel.GetMeterProvider(), otel.GetTextMapPropagator()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == nil || !sameValue(s.tp, tp) || !sameValue(s.mp, mp) || !sameValue(s.prop, prop) {
		s.h, s.tp, s.mp, s.prop = s.build(), tp, mp, prop
	}
	return s.h
}

// sameValue reports whether a and b are the same provider: the same
// pointer (or slice, map, func), or equal comparable values. Values it
// cannot tell apart safely are reported as different.
func sameValue(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if !va.IsValid() || !vb.IsValid() {
		return va.IsValid() == vb.IsValid()
	}
	if va.Type() != vb.Type() {
		return false
	}
	switch va.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return va.Pointer() == vb.Pointer()
	case reflect.Slice:
		return va.Pointer() == vb.Pointer() && va.Len() == vb.Len()
	}
	return va.Comparable() && vb.Comparable() && va.Equal(vb)
}

// dialledHandler reports every call's peer as the path dialled.
type dialledHandler struct {
	stats.Handler
	addr net.Addr
}

func (h *dialledHandler) HandleRPC(ctx context.Context, rs stats.RPCStats) {
	if oh, ok := rs.(*stats.OutHeader); ok && oh.Client && isUnix(oh.RemoteAddr) {
		c := *oh
		c.RemoteAddr = h.addr
		rs = &c
	}
	h.Handler.HandleRPC(ctx, rs)
}

// ServerHandler returns the tracing stats handler of a gRPC server. Calls
// that arrive on a pkg/unixsock listener get the socket's path as their
// server.address.
func ServerHandler(opts ...otelgrpc.Option) stats.Handler {
	return &servedHandler{Handler: otelgrpc.NewServerHandler(opts...)}
}

// servedHandler reports the local address of a call that came in on a
// pkg/unixsock listener as the path that socket is served at.
type servedHandler struct{ stats.Handler }

func (h *servedHandler) HandleRPC(ctx context.Context, rs stats.RPCStats) {
	if ih, ok := rs.(*stats.InHeader); ok && !ih.Client && isUnix(ih.LocalAddr) {
		if served, ok := unixsock.ServedPath(ih.LocalAddr.String()); ok {
			c := *ih
			c.LocalAddr = &net.UnixAddr{Name: served, Net: "unix"}
			rs = &c
		}
	}
	h.Handler.HandleRPC(ctx, rs)
}

func isUnix(a net.Addr) bool { return a != nil && a.Network() == "unix" }
