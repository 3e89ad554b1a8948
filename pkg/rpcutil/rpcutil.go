// Package rpcutil builds every gRPC server and client in nodeplug, so that
// interceptors, tracing and the dialling rule are set in one place.
//
// Transport security is the caller's choice, not this package's: servers
// and clients are plaintext unless the caller passes credentials. pkg/app
// passes them for the API: the server gets access.Credentials (the peer's
// SO_PEERCRED on the Unix socket, mutual TLS on --listen-tcp), and a
// host:port peer is dialled with TLS credentials, which override the
// plaintext default set here. The other Unix sockets (kubelet.sock, pod
// resources, plugins) are plaintext, guarded by their file modes.
package rpcutil

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
)

// NewServer returns a gRPC server with the OTel stats handler (health checks
// filtered out), slog logging, error-to-status mapping and panic recovery,
// plus the health and reflection services, and the default pool of handler
// goroutines (see NewServerPool). Callers register their services and then
// mark health SERVING.
func NewServer(log *slog.Logger, opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	return NewServerPool(log, 0, opts...)
}

// NewServerPool is NewServer with a pool of at least workers handler
// goroutines. The pool is kept between calls: a new goroutine per call grows
// its stack again through every deep call path (tracing, logging,
// protobuf). When every worker is busy gRPC starts a goroutine for the
// call, so a server that takes many calls at once sizes its pool to them.
// A workers below the default (4 per CPU) keeps the default. This is the
// one place nodeplug sizes a server's pool.
func NewServerPool(log *slog.Logger, workers int, opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	logger := interceptorLogger(log)
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(serverCodeToLevel),
	}
	recoveryOpts := []recovery.Option{recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in gRPC handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})}
	base := []grpc.ServerOption{
		grpc.NumStreamWorkers(streamWorkers(workers)),
		grpc.StatsHandler(telemetry.ServerHandler(otelgrpc.WithFilter(filters.Not(filters.HealthCheck())))),
		grpc.ChainUnaryInterceptor(
			logging.UnaryServerInterceptor(logger, logOpts...),
			unaryErrors,
			recovery.UnaryServerInterceptor(recoveryOpts...),
		),
		grpc.ChainStreamInterceptor(
			logging.StreamServerInterceptor(logger, logOpts...),
			streamErrors,
			recovery.StreamServerInterceptor(recoveryOpts...),
		),
	}
	s := grpc.NewServer(append(base, opts...)...)
	h := health.NewServer()
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
	return s, h
}

// streamWorkers is the size of a server's handler pool: 4 per CPU, or
// workers when that is larger.
func streamWorkers(workers int) uint32 {
	return uint32(max(workers, 4*runtime.GOMAXPROCS(0)))
}

// serverCodeToLevel logs successful and expected calls at debug, so routine
// traffic does not flood the log.
func serverCodeToLevel(c codes.Code) logging.Level {
	switch c {
	case codes.OK, codes.Canceled, codes.NotFound, codes.AlreadyExists, codes.InvalidArgument, codes.FailedPrecondition:
		return logging.LevelDebug
	case codes.Internal, codes.Unknown, codes.DataLoss:
		return logging.LevelError
	default:
		return logging.LevelWarn
	}
}

func unaryErrors(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	return resp, errdefs.ToGRPC(err)
}

func streamErrors(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return errdefs.ToGRPC(handler(srv, ss))
}

// interceptorLogger adapts slog to the go-grpc-middleware logger.
func interceptorLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}

// IsUnixPath reports whether addr names a Unix socket (an absolute path)
// rather than a host:port.
func IsUnixPath(addr string) bool { return strings.HasPrefix(addr, "/") }

// unixDialer returns a dialer for the Unix socket whose path is exactly
// path. The path is captured here rather than taken from the gRPC target:
// gRPC parses every target as a URL, so '#' and '?' in a file name would cut
// the path and '%xx' would be decoded, and another file than the one
// checked would be dialled.
func unixDialer(path string) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
}

// peerConnectParams keep reconnection to a restarted peer service within a
// quarter second (gRPC's default backoff grows to two minutes while a peer
// is down); a peer is a local socket, so a refused dial costs nothing.
var peerConnectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 250 * time.Millisecond},
	MinConnectTimeout: 5 * time.Second,
}

// newClient builds every client connection: the raw-path Unix dialer for
// absolute paths, passthrough for host:port, the OTel stats handler (so
// outgoing calls are traced and carry the trace context), and plaintext
// transport credentials as the default, which credentials in opts
// override (pkg/app's mutual TLS for host:port peers).
// The connection is lazy: nothing is dialled until the first call.
func newClient(addr string, opts []grpc.DialOption) (*grpc.ClientConn, error) {
	if addr == "" {
		return nil, fmt.Errorf("empty address: %w", errdefs.ErrInvalidArgument)
	}
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// server.address is the path dialled (the kernel names a Unix
		// connection by its server's bound name: telemetry).
		grpc.WithStatsHandler(telemetry.ClientHandler(addr)),
	}
	if IsUnixPath(addr) {
		// The authority is a fixed name: the path is not a host, and some
		// servers (the kubelet's peers among them) reject odd authorities.
		base = append(base, grpc.WithContextDialer(unixDialer(addr)), grpc.WithAuthority("localhost"))
		// The target only names the connection (in gRPC's own logs); the
		// dialer above decides what is dialled.
		addr = (&url.URL{Path: addr}).EscapedPath()
	}
	return grpc.NewClient("passthrough:///"+addr, append(base, opts...)...)
}

// DialPeer returns a connection to a nodeplug service (or any gRPC server)
// at addr: an absolute Unix socket path, dialled as exactly that path, or a
// host:port. It reconnects to a restarted peer within a quarter second.
func DialPeer(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	base := []grpc.DialOption{grpc.WithConnectParams(peerConnectParams)}
	return newClient(addr, append(base, opts...))
}

// DialPlugin returns a connection to a plugin's Unix socket at path, dialled
// as exactly that path, with small transport buffers (a node may hold a
// connection per plugin and the messages are small). Callers add their own
// connect parameters.
func DialPlugin(path string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if !IsUnixPath(path) {
		return nil, fmt.Errorf("plugin socket %q is not an absolute path: %w", path, errdefs.ErrInvalidArgument)
	}
	base := []grpc.DialOption{
		grpc.WithReadBufferSize(4 << 10),
		grpc.WithWriteBufferSize(4 << 10),
	}
	return newClient(path, append(base, opts...))
}

// StopGracefully stops s, letting running calls finish for at most timeout,
// then cutting the rest off. Streams never finish on their own, so the
// timeout is what ends them.
func StopGracefully(s *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.Stop()
		<-done
	}
}
