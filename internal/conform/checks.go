package conform

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
)

// maxAllocateDevices bounds how many devices the Allocate checks use, so a
// plugin with hundreds of devices is not asked hundreds of times.
const maxAllocateDevices = 16

// deviceSet is the latest device list the plugin sent.
type deviceSet []*pluginapi.Device

// healthy returns the IDs of healthy devices that are valid and unique,
// sorted: the devices the kubelet would allocate.
func (d deviceSet) healthy() []string {
	seen := map[string]int{}
	for _, dev := range d {
		seen[dev.GetID()]++
	}
	var out []string
	for _, dev := range d {
		if dev.GetHealth() == pluginapi.Healthy && seen[dev.GetID()] == 1 && bounds.DeviceID(dev.GetID()) == nil {
			out = append(out, dev.GetID())
		}
	}
	sort.Strings(out)
	return out
}

func (r *runner) checkOptions() {
	s := r.sess
	if s.optsErr != nil {
		r.record(CheckOptions, Fail, time.Time{}, "GetDevicePluginOptions at %s failed after %s: %v", s.endpoint, s.optsTook.Round(time.Millisecond), s.optsErr)
		return
	}
	r.record(CheckOptions, Pass, time.Time{}, "answered in %s: pre_start_required=%t, get_preferred_allocation_available=%t",
		s.optsTook.Round(time.Millisecond), s.opts.GetPreStartRequired(), s.opts.GetGetPreferredAllocationAvailable())
}

// checkStream opens ListAndWatch and checks its first response, then keeps
// watching it for flaps (finished by finishFlap). It reports whether there
// is a device list to go on with.
func (r *runner) checkStream(ctx context.Context) bool {
	start := time.Now()
	r.sess.openStream()
	first, err := r.sess.stream.first(ctx, r.cfg.Timeout)
	if err != nil {
		r.record(CheckFirstResponse, Fail, start, "ListAndWatch at %s: %v", r.sess.endpoint, err)
		r.skip("no device list: the first ListAndWatch response did not arrive", CheckDeviceIDs, CheckHealth, CheckTopology, CheckHealthFlap,
			CheckAllocate, CheckAllocateUnknown, CheckPreferred, CheckPreStart, CheckConcurrentAllocate, CheckReconnect)
		return false
	}
	w := r.sess.stream
	judged, n := r.firstWithDevices(ctx, first)
	detail := fmt.Sprintf("%d devices after %s", len(first.devices), first.at.Sub(w.opened).Round(time.Millisecond))
	if len(first.devices) == 0 && len(judged.devices) > 0 {
		detail += fmt.Sprintf("; the first with devices (response %d, %d devices) after %s is the one checked", n, len(judged.devices), judged.at.Sub(w.opened).Round(time.Millisecond))
	}
	r.record(CheckFirstResponse, Pass, start, "%s", detail)
	r.devices = judged.devices
	r.checkDeviceIDs(judged.devices)
	r.checkHealthValues(judged.devices)
	r.checkTopology(judged.devices)
	return true
}

// firstWithDevices returns the first response that lists devices, and its
// number (from 1), waiting for one until Observe has passed since the
// stream opened: many plugins send an empty list first and their devices
// once they have scanned. Without one it returns first.
func (r *runner) firstWithDevices(ctx context.Context, first response) (response, int) {
	if len(first.devices) > 0 {
		return first, 1
	}
	w := r.sess.stream
	cctx, cancel := context.WithDeadline(ctx, w.opened.Add(r.cfg.Observe))
	defer cancel()
	withDevices := func(resps []response) int {
		return slices.IndexFunc(resps, func(x response) bool { return len(x.devices) > 0 })
	}
	w.waitFor(cctx, func(resps []response, _ bool) bool { return withDevices(resps) >= 0 })
	resps, _, _ := w.snapshot()
	if i := withDevices(resps); i >= 0 {
		return resps[i], i + 1
	}
	return first, 1
}

func (r *runner) checkDeviceIDs(devs []*pluginapi.Device) {
	var fs []finding
	seen := map[string]bool{}
	for _, d := range devs {
		id := d.GetID()
		if err := bounds.DeviceID(id); err != nil {
			fs = append(fs, finding{Fail, err.Error()})
			continue
		}
		if seen[id] {
			fs = append(fs, finding{Fail, fmt.Sprintf("device ID %s is listed more than once: the kubelet counts it once", bounds.Quote(id))})
		}
		seen[id] = true
		if len(id) > 63 {
			fs = append(fs, finding{Warn, fmt.Sprintf("device ID %s is longer than the 63 characters the API documents", bounds.Quote(id))})
		}
	}
	if len(devs) == 0 {
		fs = append(fs, finding{Warn, fmt.Sprintf("the plugin listed no devices within --observe (%s): its resource has capacity 0", r.cfg.Observe)})
	}
	if len(fs) == 0 {
		r.record(CheckDeviceIDs, Pass, time.Time{}, "%d unique device IDs", len(devs))
		return
	}
	r.record(CheckDeviceIDs, worst(fs), time.Time{}, "%s", texts(fs))
}

func (r *runner) checkHealthValues(devs []*pluginapi.Device) {
	var bad []string
	healthy := 0
	for _, d := range devs {
		switch d.GetHealth() {
		case pluginapi.Healthy:
			healthy++
		case pluginapi.Unhealthy:
		default:
			bad = append(bad, fmt.Sprintf("%s has health %s", bounds.Quote(d.GetID()), bounds.Quote(d.GetHealth())))
		}
	}
	if len(bad) > 0 {
		r.record(CheckHealth, Fail, time.Time{}, "%s: the kubelet counts these unhealthy (want %q or %q)", strings.Join(bad, ", "), pluginapi.Healthy, pluginapi.Unhealthy)
		return
	}
	r.record(CheckHealth, Pass, time.Time{}, "%d healthy, %d unhealthy", healthy, len(devs)-healthy)
}

// numaOnHost reports whether NUMA node id exists on this host, and whether
// the host says (false when /sys shows no NUMA nodes, as in some
// containers).
func numaOnHost(id int64) (exists, known bool) {
	if _, err := os.Stat("/sys/devices/system/node"); err != nil {
		return false, false
	}
	_, err := os.Stat(fmt.Sprintf("/sys/devices/system/node/node%d", id))
	return err == nil, true
}

func (r *runner) checkTopology(devs []*pluginapi.Device) {
	var fs []finding
	with := 0
	for _, d := range devs {
		nodes := d.GetTopology().GetNodes()
		if len(nodes) == 0 {
			continue
		}
		with++
		seen := map[int64]bool{}
		for _, n := range nodes {
			id := n.GetID()
			switch {
			case id < 0:
				fs = append(fs, finding{Fail, fmt.Sprintf("device %s names NUMA node %d", bounds.Quote(d.GetID()), id)})
			case seen[id]:
				fs = append(fs, finding{Fail, fmt.Sprintf("device %s names NUMA node %d twice", bounds.Quote(d.GetID()), id)})
			default:
				if exists, known := numaOnHost(id); known && !exists {
					fs = append(fs, finding{Warn, fmt.Sprintf("device %s names NUMA node %d, which this host does not have", bounds.Quote(d.GetID()), id)})
				}
			}
			seen[id] = true
		}
	}
	if with > 0 && with < len(devs) {
		fs = append(fs, finding{Warn, fmt.Sprintf("%d of %d devices have topology: the others get no NUMA alignment", with, len(devs))})
	}
	if len(fs) == 0 {
		if with == 0 {
			r.record(CheckTopology, Pass, time.Time{}, "no device has topology (the kubelet files them under NUMA node -1)")
		} else {
			r.record(CheckTopology, Pass, time.Time{}, "%d devices with NUMA nodes", with)
		}
		return
	}
	r.record(CheckTopology, worst(fs), time.Time{}, "%s", texts(fs))
}

// flap returns the first device whose health changed and changed back in
// resps.
func flap(resps []response) (string, []string, bool) {
	hist := map[string][]string{}
	for _, resp := range resps {
		for _, d := range resp.devices {
			h := hist[d.GetID()]
			if len(h) == 0 || h[len(h)-1] != d.GetHealth() {
				hist[d.GetID()] = append(h, d.GetHealth())
			}
		}
	}
	ids := make([]string, 0, len(hist))
	for id := range hist {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if len(hist[id]) >= 3 {
			return id, hist[id], true
		}
	}
	return "", nil, false
}

// finishFlap watches the stream opened by checkStream until Observe has
// passed since it opened (or a flap is seen, or it ends) and records
// health-flap.
func (r *runner) finishFlap(ctx context.Context) {
	w := r.sess.stream
	deadline := w.opened.Add(r.cfg.Observe)
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	w.waitFor(cctx, func(resps []response, _ bool) bool {
		_, _, f := flap(resps)
		return f
	})
	resps, ended, err := w.snapshot()
	if id, hist, f := flap(resps); f {
		r.record(CheckHealthFlap, Fail, w.opened, "device %s went %s within %d responses", bounds.Quote(id), strings.Join(hist, " → "), len(resps))
		return
	}
	if ended {
		r.record(CheckHealthFlap, Fail, w.opened, "ListAndWatch ended after %d responses: %v (the kubelet marks every device unhealthy and never reopens it)", len(resps), err)
		return
	}
	r.record(CheckHealthFlap, Pass, w.opened, "%d responses in %s, no device flapped", len(resps), r.cfg.Observe)
}

// latestHealthy returns the healthy devices of the latest response, at
// most maxAllocateDevices.
func (r *runner) latestHealthy() []string {
	devs := r.devices
	if w := r.sess.stream; w != nil {
		if resps, _, _ := w.snapshot(); len(resps) > 0 {
			devs = resps[len(resps)-1].devices
		}
	}
	ids := deviceSet(devs).healthy()
	if len(ids) > maxAllocateDevices {
		ids = ids[:maxAllocateDevices]
	}
	return ids
}

func (r *runner) allocate(ctx context.Context, reqs [][]string) (*pluginapi.AllocateResponse, error) {
	req := &pluginapi.AllocateRequest{}
	for _, ids := range reqs {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	return r.sess.client.Allocate(cctx, req)
}

func (r *runner) checkAllocate(ctx context.Context) {
	if !r.selected(CheckAllocate) {
		return
	}
	start := time.Now()
	ids := r.latestHealthy()
	if len(ids) == 0 {
		r.skip("no healthy device to allocate", CheckAllocate)
		return
	}
	// As the kubelet: one container request per call, for every device.
	for _, id := range ids {
		resp, err := r.allocate(ctx, [][]string{{id}})
		if err != nil {
			r.record(CheckAllocate, Fail, start, "Allocate of device %s failed: %v", bounds.Quote(id), err)
			return
		}
		if n := len(resp.GetContainerResponses()); n != 1 {
			r.record(CheckAllocate, Fail, start, "Allocate of device %s: %d container responses to 1 container request", bounds.Quote(id), n)
			return
		}
	}
	// One call with a container request per device, and one for all.
	reqs := [][]string{}
	for _, id := range ids {
		reqs = append(reqs, []string{id})
	}
	reqs = append(reqs, ids)
	resp, err := r.allocate(ctx, reqs)
	if err != nil {
		r.record(CheckAllocate, Fail, start, "Allocate with %d container requests failed: %v", len(reqs), err)
		return
	}
	if n := len(resp.GetContainerResponses()); n != len(reqs) {
		r.record(CheckAllocate, Fail, start, "Allocate answered %d container responses to %d container requests", n, len(reqs))
		return
	}
	r.record(CheckAllocate, Pass, start, "%d devices one by one, then %d container requests in one call", len(ids), len(reqs))
}

func (r *runner) checkAllocateUnknown(ctx context.Context) {
	if !r.selected(CheckAllocateUnknown) {
		return
	}
	start := time.Now()
	id := fmt.Sprintf("conform-no-such-device-%d", time.Now().UnixNano())
	if _, err := r.allocate(ctx, [][]string{{id}}); err != nil {
		r.record(CheckAllocateUnknown, Pass, start, "refused: %v", err)
		return
	}
	r.record(CheckAllocateUnknown, Warn, start, "Allocate of the unknown device %q succeeded (the kubelet never asks for one; a caller's mistake goes unnoticed)", id)
}

func (r *runner) checkPreferred(ctx context.Context) {
	if !r.selected(CheckPreferred) {
		return
	}
	if !r.sess.opts.GetGetPreferredAllocationAvailable() {
		r.skip("not offered (get_preferred_allocation_available=false)", CheckPreferred)
		return
	}
	start := time.Now()
	avail := r.latestHealthy()
	if len(avail) == 0 {
		r.skip("no healthy device to offer", CheckPreferred)
		return
	}
	size := min(2, len(avail))
	must := []string{avail[len(avail)-1]}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	resp, err := r.sess.client.GetPreferredAllocation(cctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: avail, MustIncludeDeviceIDs: must, AllocationSize: int32(size),
		}},
	})
	if err != nil {
		r.record(CheckPreferred, Fail, start, "GetPreferredAllocation failed: %v (the kubelet fails the allocation)", err)
		return
	}
	var fs []finding
	crs := resp.GetContainerResponses()
	if len(crs) != 1 {
		fs = append(fs, finding{Warn, fmt.Sprintf("%d container responses to 1 container request", len(crs))})
	}
	var got []string
	if len(crs) > 0 {
		got = crs[0].GetDeviceIDs()
	}
	seen := map[string]bool{}
	for _, id := range got {
		if !slices.Contains(avail, id) {
			fs = append(fs, finding{Warn, fmt.Sprintf("%s is not among the available devices", bounds.Quote(id))})
		}
		if seen[id] {
			fs = append(fs, finding{Warn, fmt.Sprintf("%s is answered twice", bounds.Quote(id))})
		}
		seen[id] = true
	}
	for _, id := range must {
		if !seen[id] {
			fs = append(fs, finding{Warn, fmt.Sprintf("the must-include device %s is missing", bounds.Quote(id))})
		}
	}
	if len(got) != size {
		fs = append(fs, finding{Warn, fmt.Sprintf("%d devices for an allocation size of %d", len(got), size)})
	}
	if len(fs) > 0 {
		r.record(CheckPreferred, Warn, start, "answered %q for available %q, must-include %q, size %d: %s (the kubelet ignores what does not fit)", got, avail, must, size, texts(fs))
		return
	}
	r.record(CheckPreferred, Pass, start, "answered %q for available %q, must-include %q, size %d", got, avail, must, size)
}

func (r *runner) checkPreStart(ctx context.Context) {
	if !r.selected(CheckPreStart) {
		return
	}
	if !r.sess.opts.GetPreStartRequired() {
		r.skip("not required (pre_start_required=false)", CheckPreStart)
		return
	}
	start := time.Now()
	ids := r.latestHealthy()
	if len(ids) == 0 {
		r.skip("no healthy device", CheckPreStart)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, PreStartTimeout)
	defer cancel()
	if _, err := r.sess.client.PreStartContainer(cctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids[:1]}); err != nil {
		r.record(CheckPreStart, Fail, start, "PreStartContainer(%q) failed: %v", ids[:1], err)
		return
	}
	r.record(CheckPreStart, Pass, start, "PreStartContainer(%q) answered", ids[:1])
}

func (r *runner) checkConcurrentAllocate(ctx context.Context) {
	if !r.selected(CheckConcurrentAllocate) {
		return
	}
	ids := r.latestHealthy()
	if len(ids) == 0 {
		r.skip("no healthy device to allocate", CheckConcurrentAllocate)
		return
	}
	start := time.Now()
	n := min(max(len(ids), 2), 8)
	gate := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			id := ids[i%len(ids)]
			resp, err := r.allocate(ctx, [][]string{{id}})
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("device %s: %v", bounds.Quote(id), err)
			case len(resp.GetContainerResponses()) != 1:
				errs[i] = fmt.Errorf("device %s: %d container responses", bounds.Quote(id), len(resp.GetContainerResponses()))
			}
		}()
	}
	close(gate)
	wg.Wait()
	var bad []string
	for _, err := range errs {
		if err != nil {
			bad = append(bad, err.Error())
		}
	}
	if len(bad) > 0 {
		r.record(CheckConcurrentAllocate, Fail, start, "%d of %d concurrent calls failed: %s", len(bad), n, strings.Join(bad, "; "))
		return
	}
	r.record(CheckConcurrentAllocate, Pass, start, "%d concurrent calls answered", n)
}

// checkReconnect closes the connection and its ListAndWatch, as a kubelet
// that stops, then connects again as the restarted kubelet does: the
// plugin must answer, send its devices to the new stream and keep serving
// through --observe. Then it does it once more: a plugin that survives one
// restart can trip over the end of the stream it opened for the first (a
// send on a closed channel a second later), so the third stream is watched
// for --observe too, on a socket given with --socket as on a plugin conform
// started.
func (r *runner) checkReconnect(ctx context.Context) {
	start := time.Now()
	var got []string
	for round := 1; round <= 2; round++ {
		n, took, msg := r.reconnectOnce(ctx)
		if msg != "" {
			if round == 2 {
				msg = "after a second reconnect (the stream of the first one closed): " + msg
			}
			r.record(CheckReconnect, Fail, start, "%s%s", msg, r.exitNote())
			return
		}
		got = append(got, fmt.Sprintf("%d devices after %s", n, took))
	}
	r.record(CheckReconnect, Pass, start, "reconnected twice: each new stream got its devices (%s), stayed open for %s, and the plugin still answered", strings.Join(got, ", then "), r.cfg.Observe)
}

// reconnectOnce closes r.sess and connects again, opens ListAndWatch,
// waits for its first response and watches it for --observe; the plugin
// must then still answer GetDevicePluginOptions. It returns how many
// devices the new stream got and after how long, or why it failed.
func (r *runner) reconnectOnce(ctx context.Context) (int, time.Duration, string) {
	old := r.sess
	old.close()
	s, err := connect(ctx, old.endpoint, r.cfg.Timeout)
	if err != nil {
		return 0, 0, fmt.Sprintf("cannot dial %s again: %v", old.endpoint, err)
	}
	r.sess = s
	if s.optsErr != nil {
		return 0, 0, fmt.Sprintf("after the old stream closed, GetDevicePluginOptions failed: %v", s.optsErr)
	}
	s.openStream()
	first, err := s.stream.first(ctx, r.cfg.Timeout)
	if err != nil {
		return 0, 0, fmt.Sprintf("the new ListAndWatch stream: %v", err)
	}
	// Whatever the plugin does about the old stream, it does now: the
	// new stream must live through the observation.
	octx, cancel := context.WithTimeout(ctx, r.cfg.Observe)
	defer cancel()
	if s.stream.waitFor(octx, func(_ []response, ended bool) bool { return ended }) {
		_, _, err := s.stream.snapshot()
		return 0, 0, fmt.Sprintf("the new ListAndWatch stream ended: %v", err)
	}
	if r.proc != nil && !r.proc.alive() {
		return 0, 0, "the plugin is no longer running"
	}
	// Judged as the first stream: by the first response with devices.
	got, _ := r.firstWithDevices(ctx, first)
	if len(got.devices) == 0 && len(r.devices) > 0 {
		return 0, 0, fmt.Sprintf("the new ListAndWatch stream listed no devices within %s (the first stream listed %d)", r.cfg.Observe, len(r.devices))
	}
	cctx, cancel2 := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel2()
	if _, err := s.client.GetDevicePluginOptions(cctx, &pluginapi.Empty{}); err != nil {
		return 0, 0, fmt.Sprintf("stopped serving after the reconnect: %v", err)
	}
	return len(got.devices), got.at.Sub(s.stream.opened).Round(time.Millisecond), ""
}

// exitNote says how the started plugin exited, if it did.
func (r *runner) exitNote() string {
	if r.proc == nil {
		return ""
	}
	if st, done := r.proc.exitState(); done {
		return "; the plugin exited: " + st
	}
	return ""
}
