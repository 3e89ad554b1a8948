package podresources

import (
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// burst makes n List calls at once and returns their errors.
func (e *env) burst(n int) []error {
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = e.client.List(ctxT(e.t), &podresourcesv1.ListPodResourcesRequest{})
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// TestRateLimit: the kubelet's limit, 100 calls a second with a burst of
// 10. Calls spaced wider than 1/100 s all succeed, whatever the machine's
// speed (each finds the token it took replaced before it comes: the bucket
// never empties); so does a burst of 10 into a full bucket. A burst far
// beyond it is refused in part with the kubelet's RESOURCE_EXHAUSTED,
// counted, and only the pod resources service is limited.
func TestRateLimit(t *testing.T) {
	e := newEnv(t)
	// Pacing is what this test is about: the gap is the limit's own
	// period plus a margin, not a wait for a state.
	const gap = time.Second/DefaultQPS + 2*time.Millisecond
	for i := range 3 * DefaultBurst {
		if _, err := e.client.List(ctxT(t), &podresourcesv1.ListPodResourcesRequest{}); err != nil {
			t.Fatalf("paced call %d: %v", i, err)
		}
		<-time.After(gap)
	}
	// The bucket is full again (it was full before each paced call and
	// one gap refills the token taken).
	for i, err := range e.burst(DefaultBurst) {
		if err != nil {
			t.Fatalf("call %d of a burst of %d into a full bucket: %v", i, DefaultBurst, err)
		}
	}

	// Far beyond: 100 calls at once take at least 0.9 s to be all allowed;
	// should a slow machine spread one burst that wide, the next is tried.
	var rejected float64
	testutil.WaitFor(t, "a burst refused in part", func() bool {
		for _, err := range e.burst(10 * DefaultBurst) {
			if err == nil {
				continue
			}
			if status.Code(err) != codes.ResourceExhausted || status.Convert(err).Message() != "rejected by rate limit" {
				t.Fatalf("a refused call: %v; want RESOURCE_EXHAUSTED \"rejected by rate limit\"", err)
			}
			rejected++
		}
		return rejected > 0
	})
	if got := value(t, e.pr.metrics.rejected); got != rejected {
		t.Fatalf("nodeplug_pod_resources_rejected_total = %v, want %v", got, rejected)
	}
	// Health on the same socket is not limited: a burst right after the
	// refusals all succeeds.
	health := healthpb.NewHealthClient(e.conn)
	var wg sync.WaitGroup
	for range 10 * DefaultBurst {
		wg.Go(func() {
			if _, err := health.Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
				t.Errorf("health check: %v", err)
			}
		})
	}
	wg.Wait()
}
