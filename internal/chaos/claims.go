package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// The claims phase's invariants, beside (a)–(f):
//
//	(g) no claim is prepared twice: the driver gets no NodePrepareResources
//	    for a claim whose prepare was acknowledged, until the release of its
//	    last pod was acknowledged;
//	(h) none is left prepared after its last pod's acknowledged release:
//	    once the load stops, every such claim is unprepared by the driver
//	    and, as nodeplug allocated it, deallocated;
//	(i) no device is in two claims: neither in two allocations in the API
//	    nor in two claims the driver holds prepared;
//	(j) no claim is unprepared while a pod whose prepare was acknowledged
//	    and whose release was not yet asked for uses it.
const (
	invClaimTwice    = "g"
	invClaimLeft     = "h"
	invDeviceTwice   = "i"
	invClaimEarlyOff = "j"
)

// claimsDriverName is the claims phase's DRA driver.
const claimsDriverName = "claims.chaos.nodeplug.test"

// claimsDevices is how many devices the driver publishes: fewer than the
// workers' claims can hold at once across unprepares still owed, so that
// allocation has to find the free ones.
const claimsDevices = 6

// ClaimsResults are the claims phase's figures.
type ClaimsResults struct {
	Workers int `json:"workers"`
	Kills   int `json:"dramanager_kills"`
	// Prepares and Releases count acknowledged PrepareResources and
	// Releases; Retried the calls that failed (a kill, no device free
	// yet) and were made again; Shared the claims two pods used.
	Prepares int `json:"acknowledged_prepares"`
	Releases int `json:"acknowledged_releases"`
	Retried  int `json:"retried_calls"`
	Shared   int `json:"shared_claims"`
	// DriverPrepares and DriverUnprepares count the claims the driver was
	// asked to prepare and unprepare.
	DriverPrepares   int `json:"driver_prepares"`
	DriverUnprepares int `json:"driver_unprepares"`
	Checks           int `json:"checks"`
}

// claimsState is the ledger of the claims phase: what the clients were
// told, and what the driver was asked.
type claimsState struct {
	h *harness
	// driver is the phase's DRA driver.
	driver   string
	operator kubernetes.Interface
	dra      dmv1.DRAServiceClient

	mu sync.Mutex
	// acked: claim UIDs whose prepare was acknowledged and whose last
	// pod's release was not; inUse: per claim UID, the pods with an
	// acknowledged prepare whose release was not asked for yet.
	acked map[string]bool
	inUse map[string]int
	// released: the claims (namespace/name by UID) whose last pod's
	// release was acknowledged.
	released map[string]string
	// prepared: the claims the driver holds prepared, with their devices
	// ("pool/device").
	prepared map[string][]string
	// names: namespace/name by claim UID, of every claim the driver saw.
	names map[string]string
	res   ClaimsResults
}

// claimsPlugin is the phase's driver: it prepares what the allocation
// names, with one CDI ID per claim, and checks (g), (i) and (j) on every
// call.
type claimsPlugin struct{ s *claimsState }

func (p claimsPlugin) PrepareResourceClaims(_ context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		uid := string(c.UID)
		s.res.DriverPrepares++
		s.names[uid] = c.Namespace + "/" + c.Name
		if s.acked[uid] {
			s.h.violate(Violation{Invariant: invClaimTwice, When: "claims: NodePrepareResources",
				Detail: fmt.Sprintf("claim %s/%s (%s) prepared again; its prepare was acknowledged and no release of its last pod was", c.Namespace, c.Name, uid)})
		}
		var devs []kubeletplugin.Device
		var names []string
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Driver != s.driver {
					continue
				}
				devs = append(devs, kubeletplugin.Device{PoolName: r.Pool, DeviceName: r.Device, Requests: []string{r.Request},
					CDIDeviceIDs: []string{s.driver + "/dev=" + uid}})
				names = append(names, r.Pool+"/"+r.Device)
			}
		}
		for other, odevs := range s.prepared {
			if other == uid {
				continue
			}
			for _, n := range names {
				for _, o := range odevs {
					if n == o {
						s.h.violate(Violation{Invariant: invDeviceTwice, When: "claims: NodePrepareResources",
							Detail: fmt.Sprintf("device %s of claim %s/%s (%s) is also in claim %s (%s), which the driver holds prepared (%s)",
								n, c.Namespace, c.Name, uid, s.names[other], other, s.standing(other))})
					}
				}
			}
		}
		s.prepared[uid] = names
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (p claimsPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		uid := string(c.UID)
		s.res.DriverUnprepares++
		if n := s.inUse[uid]; n > 0 {
			s.h.violate(Violation{Invariant: invClaimEarlyOff, When: "claims: NodeUnprepareResources",
				Detail: fmt.Sprintf("claim %s (%s) unprepared while %d pod(s) with an acknowledged prepare use it", c.NamespacedName, uid, n)})
		}
		delete(s.prepared, uid)
		out[c.UID] = nil
	}
	return out, nil
}

// standing says where the clients stand with a claim: its prepare
// acknowledged, its last pod's release acknowledged, or neither (its
// prepare not acknowledged yet).
func (s *claimsState) standing(uid string) string {
	switch {
	case s.acked[uid]:
		return "its prepare acknowledged, its last pod not released"
	case s.released[uid] != "":
		return "its last pod's release acknowledged"
	}
	return "no prepare of it acknowledged yet"
}

func (claimsPlugin) HandleError(context.Context, error, string) {}

func (claimsPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// claimsPhase runs cfg.ClaimWorkers clients preparing and releasing claims
// (each a new claim; every other one shared by two pods) through
// DRAService.PrepareResources and Release, kills the dramanager
// cfg.ClaimKills times while they do, checks (i) in the API after each
// restart and, once the load stops, (h).
func (h *harness) claimsPhase(ctx context.Context) error {
	if h.cfg.ClaimWorkers == 0 {
		return nil
	}
	h.logf("claims: %d clients preparing and releasing, %d dramanager kills", h.cfg.ClaimWorkers, h.cfg.ClaimKills)
	s := &claimsState{h: h, driver: claimsDriverName, acked: map[string]bool{}, inUse: map[string]int{}, released: map[string]string{}, prepared: map[string][]string{}, names: map[string]string{}}
	s.res.Workers = h.cfg.ClaimWorkers
	defer func() {
		s.mu.Lock()
		res := s.res
		s.mu.Unlock()
		h.mu.Lock()
		h.res.Claims = res
		h.mu.Unlock()
	}()
	d, err := h.startClaimDriver(ctx, claimsDriverName, claimsPlugin{s}, claimsDevices)
	if err != nil {
		return fmt.Errorf("claims: %w", err)
	}
	defer d.stop()
	s.operator, s.dra = d.operator, d.dra

	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errc := make(chan error, h.cfg.ClaimWorkers)
	for w := range h.cfg.ClaimWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.work(wctx, w); err != nil && wctx.Err() == nil {
				errc <- err
			}
		}()
	}
	stop := func() { cancel(); wg.Wait() }
	defer stop()
	for i := range h.cfg.ClaimKills {
		before := s.prepares()
		if err := h.awaitKillMoment(ctx, errc, func() bool { return s.prepares() >= before+h.cfg.ClaimWorkers }, 50*time.Millisecond); err != nil {
			return err
		}
		when := fmt.Sprintf("claims kill %d", i+1)
		if err := h.killRestart(ctx, "dramanager"); err != nil {
			return err
		}
		s.mu.Lock()
		s.res.Kills++
		s.mu.Unlock()
		if err := s.checkAPI(ctx, when); err != nil {
			return err
		}
		if _, err := h.converge(ctx, when, "dramanager"); err != nil {
			return err
		}
	}
	stop()
	select {
	case err := <-errc:
		return err
	default:
	}
	return s.checkLeft(ctx)
}

// claimDriver is a DRA driver of a phase's own, on the upstream helper,
// with the clients the phase needs: the operator's, to the API, and the
// dramanager's DRAService.
type claimDriver struct {
	operator kubernetes.Interface
	dra      dmv1.DRAServiceClient
	stop     func() // stops the driver and closes the dramanager's connection
}

// startClaimDriver connects to the API as the operator and to the
// dramanager, starts plugin as driver name on the upstream helper,
// publishes devices dev-0 … dev-(devices-1) on the local API's one Node
// and creates their DeviceClass.
func (h *harness) startClaimDriver(ctx context.Context, name string, plugin kubeletplugin.DRAPlugin, devices int) (claimDriver, error) {
	var d claimDriver
	driverCS, err := h.draClient(layout.KubeconfigFile(h.root))
	if err != nil {
		return d, fmt.Errorf("the driver kubeconfig: %w", err)
	}
	if d.operator, err = h.draClient(layout.IdentityKubeconfigFile(h.root, "operator")); err != nil {
		return d, fmt.Errorf("the operator kubeconfig: %w", err)
	}
	nodes, err := d.operator.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		return d, fmt.Errorf("the local API's one Node: %v (%v)", nodes, err)
	}
	node := nodes.Items[0].Name
	conn, err := rpcutil.DialPeer(h.st.Addr("dramanager"))
	if err != nil {
		return d, err
	}
	d.dra = dmv1.NewDRAServiceClient(conn)
	dataDir := filepath.Join(h.root, "plugins", name)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return d, errors.Join(err, conn.Close())
	}
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.DriverName(name), kubeletplugin.NodeName(node), kubeletplugin.KubeClient(driverCS),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(h.root, layout.PluginsRegistryDirName)),
		kubeletplugin.PluginDataDirectoryPath(dataDir))
	if err != nil {
		return d, errors.Join(fmt.Errorf("start driver %s: %w", name, err), conn.Close())
	}
	d.stop = func() { helper.Stop(); _ = conn.Close() }
	var devs []resourcev1.Device
	for i := range devices {
		devs = append(devs, resourcev1.Device{Name: fmt.Sprintf("dev-%d", i)})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}); err != nil {
		d.stop()
		return d, fmt.Errorf("publish the devices: %w", err)
	}
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", name)},
		}}},
	}
	if _, err := d.operator.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		d.stop()
		return d, fmt.Errorf("create the DeviceClass: %w", err)
	}
	return d, nil
}

func (s *claimsState) prepares() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.res.Prepares
}

// work is one client: a new claim each round, prepared for one pod (every
// other round two), prepared again, released, until ctx ends. Each call is
// made again until it is acknowledged; a call that fails for longer than
// cfg.Converge ends the phase.
func (s *claimsState) work(ctx context.Context, w int) error {
	for k := 0; ctx.Err() == nil; k++ {
		name := fmt.Sprintf("chaos-w%d-%d", w, k)
		var claim *resourcev1.ResourceClaim
		if err := s.retry(ctx, "create claim "+name, func(cctx context.Context) error {
			c, err := s.operator.ResourceV1().ResourceClaims("default").Create(cctx, &resourcev1.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
				Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
					Name: "dev", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: claimsDriverName},
				}}}},
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				c, err = s.operator.ResourceV1().ResourceClaims("default").Get(cctx, name, metav1.GetOptions{})
			}
			claim = c
			return err
		}); err != nil {
			return err
		}
		uid := string(claim.UID)
		pods := []string{name + "-a"}
		if k%2 == 1 {
			pods = append(pods, name+"-b")
			s.mu.Lock()
			s.res.Shared++
			s.mu.Unlock()
		}
		for _, pod := range pods {
			for round := range 2 { // the second is the saved answer: no driver call
				if err := s.retry(ctx, "prepare "+pod, func(cctx context.Context) error {
					_, err := s.dra.PrepareResources(cctx, &dmv1.PrepareResourcesRequest{
						PodUid: pod, PodNamespace: "default", PodName: pod,
						PodClaims:  []*dmv1.PodClaim{{Name: "c", ResourceClaimName: name}},
						Containers: []*dmv1.ContainerClaims{{Name: "main", Claims: []*dmv1.ContainerClaim{{Name: "c"}}}},
					})
					return err
				}); err != nil {
					return err
				}
				s.mu.Lock()
				if round == 0 {
					s.inUse[uid]++
				}
				s.acked[uid] = true
				s.res.Prepares++
				s.mu.Unlock()
			}
		}
		for i, pod := range pods {
			s.mu.Lock()
			s.inUse[uid]--
			s.mu.Unlock()
			if err := s.retry(ctx, "release "+pod, func(cctx context.Context) error {
				_, err := s.h.dm.Release(cctx, &dmv1.ReleaseRequest{PodUid: pod})
				return err
			}); err != nil {
				return err
			}
			s.mu.Lock()
			s.res.Releases++
			if i == len(pods)-1 {
				delete(s.acked, uid)
				delete(s.inUse, uid)
				s.released[uid] = "default/" + name
			}
			s.mu.Unlock()
		}
	}
	return nil
}

// retry calls f until it succeeds, ctx ends, or it has failed for
// cfg.Converge, and counts the calls made again.
func (s *claimsState) retry(ctx context.Context, what string, f func(context.Context) error) error {
	err := retryFor(ctx, s.h.cfg.Converge, f, func() {
		s.mu.Lock()
		s.res.Retried++
		s.mu.Unlock()
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("claims: %s: still failing after %v: %w", what, s.h.cfg.Converge, err)
	}
	return err
}

// retryFor calls f, each call with a timeout of its own, until it
// succeeds, ctx ends (ctx's error) or it has failed for d (f's last
// error). retried, when not nil, is called before each call made again.
func retryFor(ctx context.Context, d time.Duration, f func(context.Context) error, retried func()) error {
	deadline := time.Now().Add(d)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return err
		}
		if retried != nil {
			retried()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// checkAPI checks (i) over the API's claims.
func (s *claimsState) checkAPI(ctx context.Context, when string) error {
	list, err := listClaims(ctx, s.operator)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.res.Checks++
	s.mu.Unlock()
	owner := map[string]string{}
	for _, c := range list {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			dev := r.Driver + "/" + r.Pool + "/" + r.Device
			if o, ok := owner[dev]; ok {
				s.h.violate(Violation{Invariant: invDeviceTwice, When: when, Detail: fmt.Sprintf("device %s allocated to claims %s and %s", dev, o, c.Name)})
			}
			owner[dev] = c.Name
		}
	}
	return nil
}

// listClaims lists the claims, retrying while the restarted dramanager
// does not answer yet.
func listClaims(ctx context.Context, cs kubernetes.Interface) ([]resourcev1.ResourceClaim, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := cs.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
		if err == nil {
			return list.Items, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("claims: list ResourceClaims: %w", errors.Join(err, ctx.Err()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkLeft checks (h) once the load stopped: within cfg.Converge every
// claim whose last pod's release was acknowledged is unprepared by the
// driver and has no allocation and no reservation left; and (i) once more.
func (s *claimsState) checkLeft(ctx context.Context) error {
	if err := s.checkAPI(ctx, "claims end"); err != nil {
		return err
	}
	deadline := time.Now().Add(s.h.cfg.Converge)
	var left []string
	for {
		left = left[:0]
		list, err := listClaims(ctx, s.operator)
		if err != nil {
			return err
		}
		s.mu.Lock()
		for _, c := range list {
			uid := string(c.UID)
			if _, ok := s.released[uid]; !ok {
				continue
			}
			if _, ok := s.prepared[uid]; ok {
				left = append(left, c.Name+" prepared in the driver")
			}
			if c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 {
				left = append(left, fmt.Sprintf("%s allocated (%v) or reserved for %v", c.Name, c.Status.Allocation != nil, c.Status.ReservedFor))
			}
		}
		s.res.Checks++
		s.mu.Unlock()
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	sort.Strings(left)
	for _, l := range left {
		s.h.violate(Violation{Invariant: invClaimLeft, When: "claims end", Detail: l + " after its last pod's acknowledged release"})
	}
	return nil
}
