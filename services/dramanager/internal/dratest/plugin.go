package dratest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// CDIID is the CDI device ID a Plugin answers for a claim's device.
func CDIID(claimUID types.UID, device string) string {
	return fmt.Sprintf("test.example.com/device=%s-%s", claimUID, device)
}

// Plugin is a DRA driver's logic for tests, behind the upstream helper: it
// prepares a claim by answering the devices of its driver in the claim's
// allocation, each with CDIID; it counts the claims it prepared and
// unprepared, fails the claims named in Fail with their message, and
// reports the health set with SetHealth (it does not support health
// reporting until SetHealth is called).
type Plugin struct {
	Driver string

	mu         sync.Mutex
	fail       map[string]string // claim name → error
	prepared   map[types.UID]int
	unprepared map[types.UID]int
	health     *kubeletplugin.DeviceHealthReport
	changed    chan struct{} // closed and replaced when health changes
	end        chan struct{} // closed and replaced by EndHealthStreams
	watches    int
	// traceparents are the W3C traceparent headers of the prepare calls.
	traceparents []string
}

// NewPlugin returns the logic of driver.
func NewPlugin(driver string) *Plugin {
	return &Plugin{Driver: driver, fail: map[string]string{}, prepared: map[types.UID]int{}, unprepared: map[types.UID]int{},
		changed: make(chan struct{}), end: make(chan struct{})}
}

// Fail makes preparing the claim named name fail with msg ("" stops it).
func (p *Plugin) Fail(name, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if msg == "" {
		delete(p.fail, name)
		return
	}
	p.fail[name] = msg
}

// Calls returns how many times the claim was prepared and unprepared.
func (p *Plugin) Calls(uid types.UID) (prepared, unprepared int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prepared[uid], p.unprepared[uid]
}

// SetHealth replaces the health the driver reports, sent at once to every
// NodeWatchResources stream.
func (p *Plugin) SetHealth(devices ...kubeletplugin.DeviceHealth) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.health = &kubeletplugin.DeviceHealthReport{Devices: devices}
	close(p.changed)
	p.changed = make(chan struct{})
}

// EndHealthStreams ends every NodeWatchResources stream (the driver's
// WatchHealthStatus returns).
func (p *Plugin) EndHealthStreams() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.end)
	p.end = make(chan struct{})
}

// HealthWatches is how many times WatchHealthStatus was called.
func (p *Plugin) HealthWatches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.watches
}

// Traceparents returns the traceparent headers the prepare calls carried.
func (p *Plugin) Traceparents() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.traceparents)
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *Plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		p.traceparents = append(p.traceparents, md.Get("traceparent")...)
	}
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		if msg, ok := p.fail[c.Name]; ok {
			out[c.UID] = kubeletplugin.PrepareResult{Err: errors.New(msg)}
			continue
		}
		var devs []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != p.Driver {
				continue
			}
			devs = append(devs, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{CDIID(c.UID, r.Device)},
			})
		}
		p.prepared[c.UID]++
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *Plugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		p.unprepared[c.UID]++
		out[c.UID] = nil
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin.
func (p *Plugin) HandleError(context.Context, error, string) {}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: the current report,
// then each new one.
func (p *Plugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	p.mu.Lock()
	p.watches++
	end := p.end
	p.mu.Unlock()
	for {
		p.mu.Lock()
		h, changed := p.health, p.changed
		p.mu.Unlock()
		if h == nil {
			return kubeletplugin.ErrHealthNotSupported
		}
		select {
		case <-ctx.Done():
			return nil
		case <-end:
			return nil
		case reports <- *h:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-end:
			return nil
		case <-changed:
		}
	}
}

// AllocatedClaim creates the ResourceClaim namespace/name with one request
// "req" of class "class" for every device given, and writes its allocation:
// those devices of driver in the node's pool, the node in its selector.
// c needs the right to write claims and their status.
func AllocatedClaim(ctx context.Context, c kubernetes.Interface, namespace, name, driver string, devices ...string) (*resourceapi.ResourceClaim, error) {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	var results []resourceapi.DeviceRequestAllocationResult
	for i, d := range devices {
		req := fmt.Sprintf("req-%d", i)
		claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourceapi.DeviceRequest{
			Name: req, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "class"},
		})
		results = append(results, resourceapi.DeviceRequestAllocationResult{Request: req, Driver: driver, Pool: Node, Device: d})
	}
	claim, err := c.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: results},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: "In", Values: []string{Node},
		}}}}},
	}
	return c.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
}
