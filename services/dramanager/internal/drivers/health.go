package drivers

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
)

// Device health values, as KEP-4680's ResourceHealth.health and the
// kubelet's DRA health cache spell them.
const (
	HealthHealthy   = "Healthy"
	HealthUnhealthy = "Unhealthy"
	HealthUnknown   = "Unknown"
)

// DefaultHealthTimeout is how long a device's reported health holds when
// its driver set no timeout of its own (the kubelet's
// DefaultHealthTimeout): after it, with no new report, the device's health
// is Unknown.
const DefaultHealthTimeout = 30 * time.Second

// maxHealthDevices bounds the devices kept per instance (the kubelet's
// maxDevicesPerDriver): reports of new devices beyond it are ignored.
const maxHealthDevices = 4096

// Health stream retry delays: a stream that ends is opened again after
// healthRetryMin, doubling up to healthRetryMax while it keeps failing.
const (
	healthRetryMin = 100 * time.Millisecond
	healthRetryMax = 5 * time.Second
)

// deviceHealth is one device's last report.
type deviceHealth struct {
	health   string
	message  string
	received time.Time
	timeout  time.Duration
}

func healthKey(pool, device string) string { return pool + "/" + device }

// Health returns the health of a driver's device and the driver's message
// for it, as the driver last reported it through NodeWatchResources: the
// serving instance's report first, else the newest instance's that has
// one. A report older than its timeout reads as Unknown with no message;
// a device no instance reported on, or a driver without a health service,
// reads as "" (nothing known).
func (r *Registry) Health(driver, pool, device string) (health, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := healthKey(pool, device)
	var found *deviceHealth
	if in := r.servingLocked(driver); in != nil {
		if h, ok := in.health[key]; ok {
			found = &h
		}
	}
	list := r.drivers[driver]
	for i := len(list) - 1; found == nil && i >= 0; i-- {
		if h, ok := list[i].health[key]; ok {
			found = &h
		}
	}
	if found == nil {
		return "", ""
	}
	if r.now().Sub(found.received) > found.timeout {
		return HealthUnknown, ""
	}
	return found.health, found.message
}

// watchHealth keeps the instance's device health from the driver's
// NodeWatchResources stream until the instance is closed, as the kubelet's
// DRA plugin manager does: a stream that ends is opened again (with
// backoff while it keeps failing), and a driver answering Unimplemented
// (it offers the service but reports nothing) is not asked again. What a
// stream reported is forgotten when it ends.
func (in *instance) watchHealth() {
	delay := healthRetryMin
	for {
		got, err := in.healthStream()
		in.setHealth(nil)
		if in.ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.Unimplemented {
			in.r.log.Info("DRA driver does not report device health", "driver", in.driver, "endpoint", in.endpoint, "error", err)
			return
		}
		if err != nil && !errors.Is(err, io.EOF) {
			in.r.log.Debug("DRA driver health stream ended", "driver", in.driver, "endpoint", in.endpoint, "error", err)
		}
		if got {
			delay = healthRetryMin
		}
		select {
		case <-in.ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, healthRetryMax)
	}
}

// healthStream reads one NodeWatchResources stream until it ends; got says
// whether it delivered anything.
func (in *instance) healthStream() (got bool, err error) {
	ctx, cancel := context.WithCancel(in.ctx)
	defer cancel()
	var stream interface {
		Recv() (*drahealthv1.NodeWatchResourcesResponse, error)
	}
	switch in.healthService {
	case drahealthv1.DRAResourceHealthService:
		stream, err = drahealthv1.NewDRAResourceHealthClient(in.conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	case drahealthv1alpha1.DRAResourceHealthService:
		stream, err = drahealthv1.V1Alpha1ClientWrapper{Client: drahealthv1alpha1.NewDRAResourceHealthClient(in.conn)}.
			NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	default:
		return false, status.Errorf(codes.Unimplemented, "health service %q is not supported by the dramanager", in.healthService)
	}
	if err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, err
		}
		got = true
		in.setHealth(resp.GetDevices())
	}
}

// setHealth merges a report into the instance's device health, as the
// kubelet's health cache does: the devices reported are updated, the
// others keep their last report until it times out (then they are
// dropped). nil forgets everything.
func (in *instance) setHealth(devices []*drahealthv1.DeviceHealth) {
	r := in.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if devices == nil {
		in.health = nil
		return
	}
	now := r.now()
	if in.health == nil {
		in.health = map[string]deviceHealth{}
	}
	reported := make(map[string]bool, len(devices))
	for _, d := range devices {
		key := healthKey(d.GetDevice().GetPoolName(), d.GetDevice().GetDeviceName())
		if _, ok := in.health[key]; !ok && len(in.health) >= maxHealthDevices {
			continue
		}
		timeout := time.Duration(d.GetHealthCheckTimeoutSeconds()) * time.Second
		if timeout <= 0 {
			timeout = DefaultHealthTimeout
		}
		in.health[key] = deviceHealth{health: healthName(d.GetHealth()), message: bounds.Text(d.GetMessage()), received: now, timeout: timeout}
		reported[key] = true
	}
	for key, h := range in.health {
		if !reported[key] && now.Sub(h.received) > h.timeout {
			delete(in.health, key)
		}
	}
}

func healthName(s drahealthv1.HealthStatus) string {
	switch s {
	case drahealthv1.HealthStatus_HEALTHY:
		return HealthHealthy
	case drahealthv1.HealthStatus_UNHEALTHY:
		return HealthUnhealthy
	default:
		return HealthUnknown
	}
}
