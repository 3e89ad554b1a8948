package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errRateLimited is the kubelet's answer to a pod resources call beyond
// its rate limit.
var errRateLimited = status.Error(codes.ResourceExhausted, "rejected by rate limit")

// RateLimit returns the server option that refuses the calls allow refuses
// (podresources.Limiter.Allow, given the full method name) at once, with
// the kubelet's RESOURCE_EXHAUSTED "rejected by rate limit".
//
// It is installed with grpc.UnaryInterceptor, which gRPC runs before every
// chained interceptor: a refused call costs no log line and no other work.
func RateLimit(allow func(fullMethod string) bool) grpc.ServerOption {
	return grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !allow(info.FullMethod) {
			return nil, errRateLimited
		}
		return handler(ctx, req)
	})
}
