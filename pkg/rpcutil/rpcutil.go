// Package rpcutil builds every gRPC server and client in nodeplug, so that
// transport security, interceptors and tracing are set in one place.
package rpcutil

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// NewServer returns a gRPC server with the OTel stats handler (health checks
// filtered out), slog logging, error-to-status mapping and panic recovery,
// plus the health and reflection services. Callers register their services
// and then mark health SERVING.
func NewServer(log *slog.Logger, opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	logger := InterceptorLogger(log)
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(serverCodeToLevel),
	}
	recoveryOpts := []recovery.Option{recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in gRPC handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})}
	base := []grpc.ServerOption{
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithFilter(filters.Not(filters.HealthCheck())))),
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

// InterceptorLogger adapts slog to the go-grpc-middleware logger.
func InterceptorLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}

// Target turns an address into a gRPC target: an absolute path or a unix:
// URL is a Unix socket; anything else is host:port.
func Target(addr string) string {
	switch {
	case strings.HasPrefix(addr, "unix:"):
		return addr
	case strings.HasPrefix(addr, "/"):
		return "unix://" + addr
	default:
		return "passthrough:///" + addr
	}
}

// NewClient returns a client connection to addr (see Target) with the OTel
// stats handler, so outgoing calls are traced and carry the trace context.
// The connection is lazy: nothing is dialled until the first call.
func NewClient(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithFilter(filters.Not(filters.HealthCheck())))),
	}
	return grpc.NewClient(Target(addr), append(base, opts...)...)
}

// PluginDialOptions are the options for connections to plugins over Unix
// sockets: small transport buffers, since the messages are small and a node
// may hold a connection per plugin.
func PluginDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithReadBufferSize(4 << 10),
		grpc.WithWriteBufferSize(4 << 10),
		grpc.WithSharedWriteBuffer(true),
	}
}
