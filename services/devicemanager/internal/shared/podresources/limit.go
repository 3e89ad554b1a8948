package podresources

import (
	"strings"

	"golang.org/x/time/rate"
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

// methodPrefix is the full-method prefix of the pod resources service.
var methodPrefix = "/" + podresourcesv1.PodResourcesLister_ServiceDesc.ServiceName + "/"

// Limiter is the rate limit of the pod resources service: qps calls a
// second with bursts of burst, shared by every caller, as the kubelet's.
// The gRPC side of it, the refusal's status, is the adapter's
// (server.RateLimit, given Allow).
type Limiter struct {
	lim *rate.Limiter
	s   *Server
}

// Limiter returns the rate limit of s's calls (see Limiter).
func (s *Server) Limiter(qps float64, burst int) *Limiter {
	return &Limiter{lim: rate.NewLimiter(rate.Limit(qps), burst), s: s}
}

// Allow reports whether a call of fullMethod may go ahead now. Calls of
// other services on the same server (health, reflection) are not limited.
// A refused call is counted in nodeplug_pod_resources_rejected_total.
func (l *Limiter) Allow(fullMethod string) bool {
	if !strings.HasPrefix(fullMethod, methodPrefix) || l.lim.Allow() {
		return true
	}
	l.s.metrics.rejected.Inc()
	return false
}
