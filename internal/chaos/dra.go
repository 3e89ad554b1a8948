package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// The DRA phase's invariants, beside (a)–(d):
//
//	(e) no acknowledged ResourceSlice write is lost: after a restart each
//	    slice holds the content of its last acknowledged write, or of a
//	    later write whose answer the kill cut off;
//	(f) resourceVersions never go backwards: a slice's is at least the one
//	    its last acknowledged write returned, and a list's at least every
//	    one acknowledged or listed before.
const (
	invSliceLost  = "e"
	invRVBackward = "f"
)

// draKillTargets are the services the DRA phase kills, in turn.
var draKillTargets = []string{"apiserver", "dramanager"}

// draSlicesPerDriver is how many slices each chaos driver keeps writing.
const draSlicesPerDriver = 3

// seqAttr is the device attribute that carries a write's sequence number.
const seqAttr = "seq"

// DRAResults are the DRA phase's figures.
type DRAResults struct {
	Drivers int `json:"drivers"`
	// Kills of nodeplug-apiserver and of the dramanager, in turn.
	Kills int `json:"kills"`
	// Acked counts acknowledged slice writes (creates and updates);
	// Uncertain those whose answer a kill cut off; Conflicts the 409s
	// (and AlreadyExists) that followed an uncertain write that had been
	// applied after all.
	Acked     int `json:"acknowledged_slice_writes"`
	Uncertain int `json:"uncertain_slice_writes"`
	Conflicts int `json:"conflicts_after_uncertain_writes"`
	Checks    int `json:"checks"`
}

// draSlice is what a writer knows of one slice.
type draSlice struct {
	name string
	obj  *resourcev1.ResourceSlice // as the API last returned it; nil: not created
	// ackedSeq and ackedRV are those of the last acknowledged write (0:
	// none); uncertain the sequence numbers written after it whose answer
	// was cut off.
	ackedSeq  int64
	ackedRV   uint64
	uncertain []int64
}

// draDriver is one chaos DRA driver: registered through plugins_registry
// by the upstream kubeletplugin helper (so the dramanager dials it and
// keeps its slices), its slices written by the harness through the
// node-local API with the driver kubeconfig, every acknowledgement
// recorded.
type draDriver struct {
	name   string
	helper *kubeletplugin.Helper
	mu     sync.Mutex // guards slices and seq
	slices []*draSlice
	seq    int64
}

// draState is the DRA phase's state.
type draState struct {
	node    string
	driver  kubernetes.Interface // the driver kubeconfig's client
	reader  kubernetes.Interface
	drivers []*draDriver
	// pause: writers hold it shared per write; a check exclusively.
	pause sync.RWMutex
	mu    sync.Mutex // guards res and maxRV
	res   DRAResults
	maxRV uint64 // the highest resourceVersion acknowledged or listed
}

// chaosPlugin is the DRA service of a chaos driver: it is dialled and kept
// connected; no claim is ever sent to it.
type chaosPlugin struct{}

func (chaosPlugin) PrepareResourceClaims(context.Context, []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	return nil, errors.New("chaos drivers prepare no claims")
}

func (chaosPlugin) UnprepareResourceClaims(context.Context, []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return nil, errors.New("chaos drivers prepare no claims")
}

func (chaosPlugin) HandleError(context.Context, error, string) {}

func (chaosPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// draClient loads a kubeconfig nodeplug-apiserver wrote, unthrottled and
// with a short timeout, so that a call to a killed API server fails fast.
func (h *harness) draClient(file string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", file)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst, cfg.Timeout = 1000, 1000, 5*time.Second
	return kubernetes.NewForConfig(cfg)
}

// draPhase starts the DRA drivers, kills nodeplug-apiserver and the
// dramanager in turn, cfg.DRAKills times, while they publish, and checks (e) and (f) and the drivers'
// connections after each restart, and the device plugins' invariants too.
func (h *harness) draPhase(ctx context.Context) error {
	if h.cfg.DRADrivers == 0 {
		return nil
	}
	h.logf("DRA: %d drivers publishing %d slices each, %d kills of the apiserver and the dramanager in turn", h.cfg.DRADrivers, draSlicesPerDriver, h.cfg.DRAKills)
	d := &draState{}
	h.dra = d
	if err := h.draConnect(ctx, d); err != nil {
		return err
	}
	defer d.stopDrivers()
	if err := h.draStartDrivers(ctx, d); err != nil {
		return err
	}
	d.res.Drivers = len(d.drivers)
	defer h.draPublish()

	errc, stopWriters := h.draStartWriters(ctx)
	defer stopWriters()
	if err := h.draConverge(ctx, "DRA start"); err != nil {
		return err
	}
	for i := range h.cfg.DRAKills {
		if err := h.draKill(ctx, i, errc); err != nil {
			return err
		}
	}
	select {
	case err := <-errc:
		return err
	default:
	}
	return h.draConverge(ctx, "end of DRA")
}

// draConnect makes d's clients of the local API, with the driver and the
// reader kubeconfigs, and finds its one Node.
func (h *harness) draConnect(ctx context.Context, d *draState) error {
	var err error
	if d.driver, err = h.draClient(layout.KubeconfigFile(h.root)); err != nil {
		return fmt.Errorf("DRA: the driver kubeconfig: %w", err)
	}
	if d.reader, err = h.draClient(layout.IdentityKubeconfigFile(h.root, "reader")); err != nil {
		return fmt.Errorf("DRA: the reader kubeconfig: %w", err)
	}
	nodes, err := d.reader.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		return fmt.Errorf("DRA: the local API's one Node: %v (%v)", nodes, err)
	}
	d.node = nodes.Items[0].Name
	return nil
}

// draStartDrivers starts cfg.DRADrivers chaos drivers, each registered
// through plugins_registry by the kubeletplugin helper with
// draSlicesPerDriver slices to write, and adds each to d.drivers once
// started (d.stopDrivers stops them).
func (h *harness) draStartDrivers(ctx context.Context, d *draState) error {
	for i := range h.cfg.DRADrivers {
		name := fmt.Sprintf("dra-%d.chaos.nodeplug.test", i)
		dataDir := filepath.Join(h.root, "plugins", name)
		if err := os.MkdirAll(dataDir, 0o750); err != nil {
			return err
		}
		helper, err := kubeletplugin.Start(ctx, chaosPlugin{},
			kubeletplugin.DriverName(name), kubeletplugin.NodeName(d.node), kubeletplugin.KubeClient(d.driver),
			kubeletplugin.RegistrarDirectoryPath(filepath.Join(h.root, layout.PluginsRegistryDirName)),
			kubeletplugin.PluginDataDirectoryPath(dataDir))
		if err != nil {
			return fmt.Errorf("DRA: start driver %s: %w", name, err)
		}
		dr := &draDriver{name: name, helper: helper}
		for j := range draSlicesPerDriver {
			dr.slices = append(dr.slices, &draSlice{name: fmt.Sprintf("%s-%d", name, j)})
		}
		d.drivers = append(d.drivers, dr)
	}
	return nil
}

// stopDrivers stops the drivers' helpers, the last started first.
func (d *draState) stopDrivers() {
	for i := len(d.drivers) - 1; i >= 0; i-- {
		d.drivers[i].helper.Stop()
	}
}

// draPublish copies the DRA phase's figures into the harness's results.
func (h *harness) draPublish() {
	d := h.dra
	d.mu.Lock()
	res := d.res
	d.mu.Unlock()
	h.mu.Lock()
	h.res.DRA = res
	h.mu.Unlock()
}

// draStartWriters starts a writer per driver. A writer's error comes on
// errc; stop stops the writers and waits for them.
func (h *harness) draStartWriters(ctx context.Context) (errc <-chan error, stop func()) {
	d := h.dra
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, len(d.drivers))
	for _, dr := range d.drivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.draWrite(wctx, dr); err != nil {
				errs <- err
			}
		}()
	}
	return errs, func() { cancel(); wg.Wait() }
}

// draKill kills the i-th service of draKillTargets (in turn) while the
// drivers publish, restarts it, and checks that the DRA drivers and the
// device plugins converge again.
func (h *harness) draKill(ctx context.Context, i int, errc <-chan error) error {
	if err := h.draAwaitKillMoment(ctx, errc); err != nil {
		return err
	}
	// The API server holds the slices, the dramanager the
	// drivers' connections (and deletes a gone driver's slices): each
	// is killed in turn.
	svc := draKillTargets[i%len(draKillTargets)]
	when := fmt.Sprintf("DRA kill %d (%s)", i+1, svc)
	if err := h.killRestart(ctx, svc); err != nil {
		return err
	}
	d := h.dra
	d.mu.Lock()
	d.res.Kills++
	d.mu.Unlock()
	if err := h.draConverge(ctx, when); err != nil {
		return err
	}
	_, err := h.converge(ctx, when, svc)
	return err
}

// draAwaitKillMoment waits until the drivers publish: once some writes
// were acknowledged since the last check, a random moment later. It
// returns a writer's error from errc, if one comes first.
func (h *harness) draAwaitKillMoment(ctx context.Context, errc <-chan error) error {
	d := h.dra
	acked := d.acked()
	return h.awaitKillMoment(ctx, errc, func() bool { return d.acked() >= acked+len(d.drivers) }, h.cfg.Interval)
}

// awaitKillMoment waits until progressed says the load moved on, then a
// random moment of at most pause. It returns the load's error from errc,
// if one comes first.
func (h *harness) awaitKillMoment(ctx context.Context, errc <-chan error, progressed func() bool, pause time.Duration) error {
	for !progressed() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return err
		case <-time.After(5 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Duration(h.intn(int(max(pause/time.Millisecond, 1)))) * time.Millisecond):
	}
	return nil
}

func (d *draState) acked() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.res.Acked
}

// draWrite writes dr's slices in turn until ctx ends: each write a new
// sequence number and a device list that changes with it. It returns an
// error only for an answer no write should get (a 4xx other than the
// conflicts an applied uncertain write explains).
func (h *harness) draWrite(ctx context.Context, dr *draDriver) error {
	d := h.dra
	for i := 0; ctx.Err() == nil; i++ {
		d.pause.RLock()
		err := h.draWriteOne(ctx, dr, dr.slices[i%len(dr.slices)])
		d.pause.RUnlock()
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

func (h *harness) draWriteOne(ctx context.Context, dr *draDriver, s *draSlice) error {
	d := h.dra
	dr.mu.Lock()
	defer dr.mu.Unlock()
	dr.seq++
	seq := dr.seq
	want := d.sliceFor(dr.name, s, seq)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var got *resourcev1.ResourceSlice
	var err error
	if s.obj == nil {
		got, err = d.driver.ResourceV1().ResourceSlices().Create(wctx, want, metav1.CreateOptions{})
	} else {
		got, err = d.driver.ResourceV1().ResourceSlices().Update(wctx, want, metav1.UpdateOptions{})
	}
	switch {
	case err == nil:
		rv, perr := strconv.ParseUint(got.ResourceVersion, 10, 64)
		if perr != nil {
			return fmt.Errorf("DRA: slice %s: resourceVersion %q: %w", s.name, got.ResourceVersion, perr)
		}
		s.obj, s.ackedSeq, s.ackedRV, s.uncertain = got, seq, rv, nil
		d.mu.Lock()
		d.res.Acked++
		d.maxRV = max(d.maxRV, rv)
		d.mu.Unlock()
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
		// A write whose answer was cut off had been applied: take the
		// slice as it is stored.
		d.mu.Lock()
		d.res.Conflicts++
		d.mu.Unlock()
		cur, gerr := d.driver.ResourceV1().ResourceSlices().Get(wctx, s.name, metav1.GetOptions{})
		if gerr == nil {
			s.obj = cur
		}
		if len(s.uncertain) == 0 {
			return fmt.Errorf("DRA: slice %s: %v with no uncertain write before it", s.name, err)
		}
	case apierrors.IsNotFound(err):
		if s.ackedSeq != 0 {
			h.violate(Violation{Invariant: invSliceLost, When: "DRA write", Detail: fmt.Sprintf("slice %s not found; its write %d (resourceVersion %d) was acknowledged", s.name, s.ackedSeq, s.ackedRV)})
		}
		// Made again from scratch: nothing acknowledged is left of it.
		s.obj, s.ackedSeq, s.ackedRV, s.uncertain = nil, 0, 0, nil
	case isAPIStatus(err):
		return fmt.Errorf("DRA: write %d of slice %s: %w", seq, s.name, err)
	default:
		// No answer (the API server was killed): maybe written.
		s.uncertain = append(s.uncertain, seq)
		d.mu.Lock()
		d.res.Uncertain++
		d.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func isAPIStatus(err error) bool {
	var st apierrors.APIStatus
	return errors.As(err, &st)
}

// sliceFor is write seq of s: seq%3+1 devices, each with the seq attribute.
func (d *draState) sliceFor(driver string, s *draSlice, seq int64) *resourcev1.ResourceSlice {
	out := &resourcev1.ResourceSlice{}
	if s.obj != nil {
		out = s.obj.DeepCopy()
	}
	out.Name = s.name
	node := d.node
	out.Spec = resourcev1.ResourceSliceSpec{
		Driver:   driver,
		NodeName: &node,
		Pool:     resourcev1.ResourcePool{Name: s.name, Generation: seq, ResourceSliceCount: 1},
	}
	for k := range seq%3 + 1 {
		v := seq
		out.Spec.Devices = append(out.Spec.Devices, resourcev1.Device{
			Name:       fmt.Sprintf("dev-%d", k),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{seqAttr: {IntValue: &v}},
		})
	}
	return out
}

// draConverge pauses the writers, waits until the local API answers and
// every driver has a connected serving instance again, and checks (e) and
// (f).
func (h *harness) draConverge(ctx context.Context, when string) error {
	d := h.dra
	d.pause.Lock()
	defer d.pause.Unlock()
	deadline := time.Now().Add(h.cfg.Converge)
	var last string
	for {
		list, err := d.reader.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err == nil {
			last = h.draConnected(ctx)
			if last == "" {
				h.draCheck(when, list)
				return nil
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			h.violate(Violation{Invariant: "c", When: when, Detail: "DRA did not converge: " + last})
			return fmt.Errorf("%s: %w within %v: %s", when, errConverge, h.cfg.Converge, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// draConnected is "" once ListDRADrivers shows each driver with a serving,
// connected instance, else what is missing.
func (h *harness) draConnected(ctx context.Context) string {
	conn, err := rpcutil.DialPeer(h.st.Addr("dramanager"))
	if err != nil {
		return err.Error()
	}
	defer conn.Close()
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := dmv1.NewDRAServiceClient(conn).ListDRADrivers(lctx, &dmv1.ListDRADriversRequest{})
	if err != nil {
		return "ListDRADrivers: " + err.Error()
	}
	serving := map[string]bool{}
	for _, dr := range resp.GetDrivers() {
		for _, in := range dr.GetInstances() {
			serving[dr.GetName()] = serving[dr.GetName()] || (in.GetServing() && in.GetConnected())
		}
	}
	for _, dr := range h.dra.drivers {
		if !serving[dr.name] {
			return "DRA driver " + dr.name + " has no connected serving instance"
		}
	}
	return ""
}

// draCheck checks (e) and (f) on a list taken with the writers paused.
func (h *harness) draCheck(when string, list *resourcev1.ResourceSliceList) {
	d := h.dra
	var vs []Violation
	add := func(inv, format string, args ...any) {
		vs = append(vs, Violation{Invariant: inv, When: when, Detail: fmt.Sprintf(format, args...)})
	}
	byName := map[string]*resourcev1.ResourceSlice{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	d.mu.Lock()
	maxRV := d.maxRV
	d.mu.Unlock()
	listRV, err := strconv.ParseUint(list.ResourceVersion, 10, 64)
	if err != nil {
		add(invRVBackward, "list resourceVersion %q: %v", list.ResourceVersion, err)
	} else if listRV < maxRV {
		add(invRVBackward, "list resourceVersion %d below %d, acknowledged or listed before", listRV, maxRV)
	}
	for _, dr := range d.drivers {
		dr.mu.Lock()
		for _, s := range dr.slices {
			if s.ackedSeq == 0 {
				continue
			}
			o := byName[s.name]
			if o == nil {
				add(invSliceLost, "slice %s gone; its write %d (resourceVersion %d) was acknowledged", s.name, s.ackedSeq, s.ackedRV)
				continue
			}
			if seq := seqOf(o); seq != s.ackedSeq && !slices.Contains(s.uncertain, seq) {
				add(invSliceLost, "slice %s holds write %d; %d was acknowledged last (later, cut off: %v)", s.name, seq, s.ackedSeq, s.uncertain)
			}
			if rv, err := strconv.ParseUint(o.ResourceVersion, 10, 64); err != nil || rv < s.ackedRV {
				add(invRVBackward, "slice %s at resourceVersion %q, below %d acknowledged", s.name, o.ResourceVersion, s.ackedRV)
			}
		}
		dr.mu.Unlock()
	}
	d.mu.Lock()
	d.res.Checks++
	if err == nil {
		d.maxRV = max(d.maxRV, listRV)
	}
	d.mu.Unlock()
	h.violate(vs...)
}

// seqOf is the seq attribute of a slice's first device (-1: none).
func seqOf(s *resourcev1.ResourceSlice) int64 {
	if len(s.Spec.Devices) == 0 {
		return -1
	}
	if v := s.Spec.Devices[0].Attributes[seqAttr].IntValue; v != nil {
		return *v
	}
	return -1
}
