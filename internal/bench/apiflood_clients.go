package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// The figures the API server's metrics give.
const (
	metricHeap    = "go_memstats_heap_inuse_bytes"
	metricWatches = "nodeplug_resource_api_watches"
	metricRefused = "nodeplug_resource_api_watches_refused_total"
	metricCutoffs = "nodeplug_resource_api_watch_cutoffs_total"
)

// scrape reads the server's metrics as "name{labels}" → value.
func (s *floodServer) scrape(ctx context.Context) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.metrics, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if strings.HasPrefix(line, "#") || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

func (s *floodServer) heapMiB(ctx context.Context) float64 {
	m, err := s.scrape(ctx)
	if err != nil {
		return 0
	}
	return m[metricHeap] / (1 << 20)
}

// boundCounts are the refused and cut-off watches, by bound.
func (s *floodServer) boundCounts(ctx context.Context) (refused, cut map[string]float64) {
	refused, cut = map[string]float64{}, map[string]float64{}
	m, _ := s.scrape(ctx)
	for k, v := range m {
		if b, ok := labelOf(k, metricRefused); ok {
			refused[b] = v
		}
		if b, ok := labelOf(k, metricCutoffs); ok {
			cut[b] = v
		}
	}
	return refused, cut
}

// labelOf is the bound label of a sample of metric.
func labelOf(sample, metric string) (string, bool) {
	rest, ok := strings.CutPrefix(sample, metric+`{bound="`)
	if !ok {
		return "", false
	}
	return strings.TrimSuffix(rest, `"}`), true
}

// waitIdle waits until the server has served its metrics and given back
// what its start took, so that the start figure is its idle one.
func (s *floodServer) waitIdle(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := s.scrape(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			return fmt.Errorf("nodeplug-apiserver metrics at %s: %w", s.metrics, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(3 * time.Second):
		return nil
	}
}

// waitWatches waits until the server counts n watches open.
func (s *floodServer) waitWatches(ctx context.Context, n int) (int, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := s.scrape(ctx)
		if err == nil && int(m[metricWatches]) >= n {
			return int(m[metricWatches]), nil
		}
		if time.Now().After(deadline) {
			return int(m[metricWatches]), fmt.Errorf("%v watches open after a minute, want %d (%v)", m[metricWatches], n, err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// memoryFollower samples the server's heap until stopped.
type memoryFollower struct {
	cancel context.CancelFunc
	done   chan struct{}
	peak   float64
}

func followMemory(ctx context.Context, s *floodServer) *memoryFollower {
	ctx, cancel := context.WithCancel(ctx)
	f := &memoryFollower{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			f.peak = max(f.peak, s.heapMiB(ctx))
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return f
}

// stop ends the sampling and returns the highest heap seen, in MiB.
func (f *memoryFollower) stop() float64 {
	f.cancel()
	<-f.done
	return f.peak
}

// silentWatches are watches whose client never reads their body.
type silentWatches struct {
	once  sync.Once
	conns []*tls.Conn
}

// openSilentWatches opens n watches of ResourceSlices from the start
// (the current slices first) with cfg's certificate, each on an
// HTTP/1.1 connection of its own, reads their status line and nothing
// more.
func openSilentWatches(cfg *rest.Config, n int) (*silentWatches, error) {
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	s := &silentWatches{}
	for i := range n {
		c, err := tls.Dial("tcp", u.Host, tlsCfg)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("silent watch %d: %w", i, err)
		}
		s.conns = append(s.conns, c)
		fmt.Fprintf(c, "GET /apis/resource.k8s.io/v1/resourceslices?watch=true HTTP/1.1\r\nHost: %s\r\nAccept: application/json\r\n\r\n", u.Host)
		status, err := bufio.NewReaderSize(c, 16).ReadString('\n')
		if err != nil || !strings.Contains(status, " 200 ") {
			s.close()
			return nil, fmt.Errorf("silent watch %d: %q %v", i, status, err)
		}
	}
	return s, nil
}

func (s *silentWatches) close() {
	s.once.Do(func() {
		for _, c := range s.conns {
			_ = c.Close()
		}
	})
}

// ObserverResult is what the other client saw.
type ObserverResult struct {
	Lists, ListFailures int
	SlowestListMs       float64
	// Events its watch received; WatchFailures are watch requests that
	// failed or ERROR events other than 410; WatchEnds are streams the
	// server ended (it watches again from its last resourceVersion);
	// Relists follow a 410.
	Events, WatchFailures, WatchEnds, Relists int
}

// observer lists and watches ResourceSlices until its context ends.
type observer struct {
	c    kubernetes.Interface
	wg   sync.WaitGroup
	mu   sync.Mutex
	res  ObserverResult
	last atomic.Int64 // its watch's resourceVersion
}

func startObserver(ctx context.Context, c kubernetes.Interface) *observer {
	o := &observer{c: c}
	o.wg.Add(2)
	go func() { defer o.wg.Done(); o.lister(ctx) }()
	go func() { defer o.wg.Done(); o.watcher(ctx) }()
	return o
}

func (o *observer) wait() ObserverResult {
	o.wg.Wait()
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.res
}

func (o *observer) count(f func(*ObserverResult)) {
	o.mu.Lock()
	f(&o.res)
	o.mu.Unlock()
}

// lister lists every 200 ms.
func (o *observer) lister(ctx context.Context) {
	for ctx.Err() == nil {
		start := time.Now()
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := o.c.ResourceV1().ResourceSlices().List(lctx, metav1.ListOptions{})
		cancel()
		took := float64(time.Since(start).Microseconds()) / 1000
		if ctx.Err() != nil {
			return
		}
		o.count(func(r *ObserverResult) {
			r.Lists++
			r.SlowestListMs = max(r.SlowestListMs, took)
			if err != nil {
				r.ListFailures++
			}
		})
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// watcher lists, then watches from there, again from its last
// resourceVersion when the server ends the stream, and lists again
// after a 410.
func (o *observer) watcher(ctx context.Context) {
	for ctx.Err() == nil {
		if o.last.Load() == 0 {
			list, err := o.c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
			if err != nil {
				o.failed(ctx)
				continue
			}
			rv, _ := strconv.ParseInt(list.ResourceVersion, 10, 64)
			o.last.Store(rv)
		}
		w, err := o.c.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{
			ResourceVersion: strconv.FormatInt(o.last.Load(), 10), AllowWatchBookmarks: true,
		})
		switch {
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			o.relist()
		case err != nil:
			o.failed(ctx)
		default:
			o.consume(ctx, w)
		}
	}
}

func (o *observer) relist() {
	o.last.Store(0)
	o.count(func(r *ObserverResult) { r.Relists++ })
}

func (o *observer) failed(ctx context.Context) {
	if ctx.Err() == nil {
		o.count(func(r *ObserverResult) { r.WatchFailures++ })
	}
	select {
	case <-ctx.Done():
	case <-time.After(100 * time.Millisecond):
	}
}

// consume reads one watch stream to its end.
func (o *observer) consume(ctx context.Context, w watch.Interface) {
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			if st := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(st) || apierrors.IsGone(st) {
				o.relist()
			} else {
				o.failed(ctx)
			}
			return
		}
		if m, err := meta.Accessor(ev.Object); err == nil {
			rv, _ := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
			o.last.Store(rv)
		}
		if ev.Type != watch.Bookmark {
			o.count(func(r *ObserverResult) { r.Events++ })
		}
	}
	if ctx.Err() == nil {
		o.count(func(r *ObserverResult) { r.WatchEnds++ })
	}
}

// floodNode and floodDriver are what the flood's slices name.
const (
	floodNode   = "flood-node"
	floodDriver = "flood.example.com"
)

// churn creates and deletes n slices of devices devices, one at a time.
func churn(ctx context.Context, c kubernetes.Interface, n, devices int) error {
	slices := c.ResourceV1().ResourceSlices()
	for i := range n {
		s := floodSlice(fmt.Sprintf("churn-%d", i), devices, 4, 8)
		if _, err := slices.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create slice %d: %w", i, err)
		}
		if err := slices.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete slice %d: %w", i, err)
		}
	}
	return nil
}

// floodSlice is a slice of this node with devices devices of attrs
// attributes of valueLen bytes each.
func floodSlice(name string, devices, attrs, valueLen int) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: floodDriver, NodeName: ptr.To(floodNode),
			Pool: resourcev1.ResourcePool{Name: floodNode, Generation: 1, ResourceSliceCount: 1},
		},
	}
	// The longest domain an attribute may have (63 bytes) and the
	// longest identifier (32).
	domain := strings.Repeat("d", 50) + ".example.com"
	for d := range devices {
		dev := resourcev1.Device{Name: fmt.Sprintf("dev-%d", d), Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{}}
		for a := range attrs {
			key := resourcev1.QualifiedName(fmt.Sprintf("%s/attr_%027d", domain, a))
			dev.Attributes[key] = resourcev1.DeviceAttribute{StringValue: ptr.To(strings.Repeat("v", valueLen))}
		}
		s.Spec.Devices = append(s.Spec.Devices, dev)
	}
	return s
}

// maximalMargin is what the server adds to a slice as the client encodes
// it (its uid, timestamps, resourceVersion, kind), with room to spare.
const maximalMargin = 4 << 10

// maximalSlice is as large a slice as the API stores: every device and
// attribute with the longest names and values, the annotations at their
// limit (256 KiB), and the rest made up with a device taint's value,
// which the API bounds only by the object's size. Over, it is that much
// larger than the limit.
func maximalSlice(name string, over int) (*resourcev1.ResourceSlice, int) {
	const limit = 1536 << 10
	s := floodSlice(name, 128, 32, 64)
	s.Annotations = map[string]string{"flood.example.com/pad": strings.Repeat("a", 256<<10-64)}
	target := limit - maximalMargin
	if over > 0 {
		target = limit + over
	}
	taint := resourcev1.DeviceTaint{Key: "flood.example.com/pad", Effect: resourcev1.DeviceTaintEffectNoSchedule}
	s.Spec.Devices[0].Taints = []resourcev1.DeviceTaint{taint}
	data, _ := json.Marshal(s)
	s.Spec.Devices[0].Taints[0].Value = strings.Repeat("t", max(target-len(data), 0))
	data, _ = json.Marshal(s)
	return s, len(data)
}

// updateMaximal creates a maximal slice, replaces it n times, deletes
// it, and checks that a slightly larger one is refused with 413.
func updateMaximal(ctx context.Context, c kubernetes.Interface, n int) (size int, refused bool, err error) {
	slices := c.ResourceV1().ResourceSlices()
	big, _ := maximalSlice("too-large", 64<<10)
	_, err = slices.Create(ctx, big, metav1.CreateOptions{})
	refused = apierrors.IsRequestEntityTooLargeError(err)
	s, size := maximalSlice("maximal", 0)
	cur, err := slices.Create(ctx, s, metav1.CreateOptions{})
	if err != nil {
		return size, refused, fmt.Errorf("create the maximal slice (%d bytes): %w", size, err)
	}
	for i := range n {
		cur.Spec.Pool.Generation = int64(i + 2)
		if cur, err = slices.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return size, refused, fmt.Errorf("update %d of the maximal slice: %w", i, err)
		}
	}
	if err := slices.Delete(ctx, cur.Name, metav1.DeleteOptions{}); err != nil {
		return size, refused, fmt.Errorf("delete the maximal slice: %w", err)
	}
	if !refused {
		return size, false, errors.New("a slice over the size limit was not refused with 413")
	}
	return size, refused, nil
}
