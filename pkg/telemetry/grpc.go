package telemetry

import (
	"context"
	"net"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
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
// addr. When addr is a Unix socket path, the spans' server.address is addr,
// the path dialled.
func ClientHandler(addr string, opts ...otelgrpc.Option) stats.Handler {
	h := otelgrpc.NewClientHandler(opts...)
	if !strings.HasPrefix(addr, "/") {
		return h
	}
	return &dialledHandler{Handler: h, addr: &net.UnixAddr{Name: addr, Net: "unix"}}
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
