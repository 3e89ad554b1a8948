package podresources

import (
	"context"
	"strings"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// The kubelet's rate limit of the pod resources API
// (pkg/kubelet/apis/podresources: DefaultQPS, DefaultBurstTokens).
const (
	// DefaultQPS is the sustained rate of calls allowed, per second.
	DefaultQPS = 100
	// DefaultBurst is how many calls may come at once.
	DefaultBurst = 10
)

// errRateLimited is the kubelet's answer to a call beyond the limit.
var errRateLimited = status.Error(codes.ResourceExhausted, "rejected by rate limit")

// methodPrefix is the full-method prefix of the pod resources service.
var methodPrefix = "/" + podresourcesv1.PodResourcesLister_ServiceDesc.ServiceName + "/"

// RateLimit returns the server option that limits the calls of the pod
// resources service to qps a second with bursts of burst, shared by every
// caller, as the kubelet does; a call beyond it fails at once with
// RESOURCE_EXHAUSTED "rejected by rate limit". Other services on the same
// server (health, reflection) are not limited.
//
// It is installed with grpc.UnaryInterceptor, which gRPC runs before every
// chained interceptor: a refused call costs no log line and no other work
// (it is counted in nodeplug_pod_resources_rejected_total).
func (s *Server) RateLimit(qps float64, burst int) grpc.ServerOption {
	lim := rate.NewLimiter(rate.Limit(qps), burst)
	return grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, methodPrefix) && !lim.Allow() {
			s.metrics.rejected.Inc()
			return nil, errRateLimited
		}
		return handler(ctx, req)
	})
}
