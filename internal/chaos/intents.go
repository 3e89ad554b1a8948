package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nodeplug/nodeplug/internal/stack"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// The intents phase's invariant, beside (a)–(k):
//
//	(l) no claim is stranded by a kill: after the dramanager is killed
//	    at any step of a prepare or of a release and started again, the
//	    claim ends either prepared for its pod (reserved for it, its
//	    driver holding it, nodeplug listing it prepared) or fully rolled
//	    back (no allocation, reservation or allocation marker, its driver
//	    not holding it, nodeplug recording nothing of it) — prepared only
//	    when the kill came after the prepare's commit — and no intent is
//	    left unsettled (the dramanager's
//	    nodeplug_dramanager_claim_intents is 0).
const invStranded = "l"

// intentsDriverName is the intents phase's DRA driver.
const intentsDriverName = "intents.chaos.nodeplug.test"

// The dramanager's testing hook (its claims package's CrashEnv) and its
// allocation marker (claimalloc.AllocatedByAnnotation).
const (
	crashEnv              = "NODEPLUG_CRASH_AT"
	allocatedByAnnotation = "nodeplug.io/allocated-by-node"
)

// Outcomes of a step.
const (
	outcomePrepared   = "prepared"
	outcomeRolledBack = "rolled back"
)

// intentStep is a step of a prepare or a release at which the
// dramanager is killed: through its crash hook, or (external) by the
// driver while NodePrepareResources runs.
type intentStep struct {
	name     string
	release  bool // a release's step: the pod is prepared first
	external bool
	want     string
}

// intentSteps are every step, in a prepare's and a release's order.
var intentSteps = []intentStep{
	{name: "marked", want: outcomeRolledBack},
	{name: "allocated", want: outcomeRolledBack},
	{name: "reserved", want: outcomeRolledBack},
	{name: "calling", want: outcomeRolledBack},
	{name: "during NodePrepareResources", external: true, want: outcomeRolledBack},
	{name: "prepared", want: outcomeRolledBack},
	{name: "committed", want: outcomePrepared},
	{name: "released", release: true, want: outcomeRolledBack},
	{name: "unprepared", release: true, want: outcomeRolledBack},
}

// IntentsResults are the intents phase's figures: one per step.
type IntentsResults struct {
	Steps []IntentStepResult `json:"steps"`
}

// IntentStepResult is where the claim of one step ended after the kill
// and the restart, and how long that took.
type IntentStepResult struct {
	Step    string  `json:"step"`
	Outcome string  `json:"outcome"`
	Ms      float64 `json:"settled_ms"`
}

// intentsState is the phase's driver's ledger and the clients.
type intentsState struct {
	h        *harness
	operator kubernetes.Interface
	dra      dmv1.DRAServiceClient

	mu       sync.Mutex
	prepared map[string]bool // claim UIDs the driver holds prepared
	killOn   string          // the claim whose NodePrepareResources kills the dramanager
}

// intentsPlugin is the phase's driver: it prepares what the allocation
// names and keeps what it holds prepared.
type intentsPlugin struct{ s *intentsState }

func (p intentsPlugin) PrepareResourceClaims(_ context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	s := p.s
	s.mu.Lock()
	kill := slices.ContainsFunc(claims, func(c *resourcev1.ResourceClaim) bool { return c.Name == s.killOn })
	s.mu.Unlock()
	if kill {
		s.h.st.Kill("dramanager") // its call is in flight: this is during it
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		s.prepared[string(c.UID)] = true
		var devs []kubeletplugin.Device
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				devs = append(devs, kubeletplugin.Device{PoolName: r.Pool, DeviceName: r.Device, Requests: []string{r.Request},
					CDIDeviceIDs: []string{intentsDriverName + "/dev=" + string(c.UID)}})
			}
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (p intentsPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		delete(p.s.prepared, string(c.UID))
		out[c.UID] = nil
	}
	return out, nil
}

func (intentsPlugin) HandleError(context.Context, error, string) {}

func (intentsPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// intentsPhase kills the dramanager at each step of a prepare and of a
// release of a claim of its own, starts it again, and checks (l): the
// pod is never prepared again, as a deleted pod is not.
func (h *harness) intentsPhase(ctx context.Context) error {
	if !h.cfg.Intents {
		return nil
	}
	h.logf("intents: the dramanager killed at each of %d steps of a prepare and a release", len(intentSteps))
	s := &intentsState{h: h, prepared: map[string]bool{}}
	d, err := h.startClaimDriver(ctx, intentsDriverName, intentsPlugin{s}, 2)
	if err != nil {
		return fmt.Errorf("intents: %w", err)
	}
	defer d.stop()
	s.operator, s.dra = d.operator, d.dra
	for i, st := range intentSteps {
		r, err := s.run(ctx, i, st)
		if err != nil {
			return fmt.Errorf("intents: kill %s: %w", st.name, err)
		}
		h.logf("  killed %s: %s after %.0f ms", st.name, r.Outcome, r.Ms)
		h.mu.Lock()
		h.res.Intents.Steps = append(h.res.Intents.Steps, r)
		h.mu.Unlock()
	}
	return nil
}

// run is one step: a claim of its own for a pod of its own (prepared
// first for a release's step), the dramanager killed at the step, and
// started again; then where the claim ends, and (l).
func (s *intentsState) run(ctx context.Context, i int, st intentStep) (IntentStepResult, error) {
	claim := fmt.Sprintf("intent-%d", i)
	pod := claim + "-pod"
	uid, err := s.createClaim(ctx, claim)
	if err != nil {
		return IntentStepResult{}, err
	}
	if st.release {
		if err := s.retry(ctx, func(cctx context.Context) error { return s.prepare(cctx, claim, pod) }); err != nil {
			return IntentStepResult{}, fmt.Errorf("prepare %s before its release: %w", pod, err)
		}
	}
	if err := s.arm(ctx, st, claim); err != nil {
		return IntentStepResult{}, err
	}
	victim := s.h.st.Process("dramanager")
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if st.release {
		_, _ = s.h.dm.Release(cctx, &dmv1.ReleaseRequest{PodUid: pod}, grpc.WaitForReady(true))
	} else {
		// The kill cuts the answer off; a prepare that fails before the
		// step (the driver not registered again yet) is made again.
		_ = s.retry(cctx, func(c context.Context) error {
			if err := s.prepare(c, claim, pod); err != nil && victim.Err() == nil {
				return err
			}
			return nil
		})
	}
	cancel()
	if err := s.restart(ctx, st, victim); err != nil {
		return IntentStepResult{}, err
	}
	t0 := time.Now()
	outcome, why := s.settled(ctx, claim, uid, pod)
	res := IntentStepResult{Step: st.name, Outcome: outcome, Ms: float64(time.Since(t0).Microseconds()) / 1e3}
	if outcome != st.want {
		s.h.violate(Violation{Invariant: invStranded, When: "intents: kill " + st.name,
			Detail: fmt.Sprintf("claim default/%s (%s) of pod %s is %s, want %s: %s", claim, uid, pod, outcome, st.want, why)})
	}
	if outcome == outcomePrepared {
		err = s.retry(ctx, func(cctx context.Context) error {
			_, err := s.h.dm.Release(cctx, &dmv1.ReleaseRequest{PodUid: pod})
			return err
		})
		if outcome, why = s.settled(ctx, claim, uid, pod); err == nil && outcome != outcomeRolledBack {
			err = fmt.Errorf("claim %s not rolled back after its pod's release: %s", claim, why)
		}
	}
	return res, err
}

func (s *intentsState) createClaim(ctx context.Context, name string) (string, error) {
	c, err := s.operator.ResourceV1().ResourceClaims("default").Create(ctx, &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "dev", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: intentsDriverName},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create claim %s: %w", name, err)
	}
	return string(c.UID), nil
}

// prepare asks for pod's claim, waiting for the dramanager to be
// reachable.
func (s *intentsState) prepare(ctx context.Context, claim, pod string) error {
	_, err := s.dra.PrepareResources(ctx, &dmv1.PrepareResourcesRequest{
		PodUid: pod, PodNamespace: "default", PodName: pod,
		PodClaims:  []*dmv1.PodClaim{{Name: "c", ResourceClaimName: claim}},
		Containers: []*dmv1.ContainerClaims{{Name: "main", Claims: []*dmv1.ContainerClaim{{Name: "c"}}}},
	}, grpc.WaitForReady(true))
	return err
}

// arm makes the next call die at st: the driver kills the dramanager
// during its call, or the dramanager is started again with its crash
// hook set to st (stopped first, gracefully).
func (s *intentsState) arm(ctx context.Context, st intentStep, claim string) error {
	if st.external {
		s.mu.Lock()
		s.killOn = claim
		s.mu.Unlock()
		return nil
	}
	h := s.h
	if p := h.st.Process("dramanager"); p != nil {
		_ = p.Stop(10 * time.Second)
	}
	env := h.st.Env
	h.st.Env = append(slices.Clone(env), crashEnv+"="+st.name)
	defer func() { h.st.Env = env }()
	if err := h.st.Start(ctx, "dramanager"); err != nil {
		return fmt.Errorf("start the dramanager to die at %s: %w", st.name, err)
	}
	return nil
}

// restart waits for victim to have died at st, then starts the
// dramanager again, as it always starts, and waits for convergence.
func (s *intentsState) restart(ctx context.Context, st intentStep, victim *stack.Process) error {
	deadline := time.Now().Add(s.h.cfg.Converge)
	for victim.Err() == nil {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the dramanager did not die at %s within %v", st.name, s.h.cfg.Converge)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.mu.Lock()
	s.killOn = ""
	s.mu.Unlock()
	s.h.mu.Lock()
	s.h.res.Kills["dramanager"]++
	s.h.mu.Unlock()
	if err := s.h.st.Start(ctx, "dramanager"); err != nil {
		return fmt.Errorf("restart the dramanager: %w", err)
	}
	_, err := s.h.converge(ctx, "intents: kill "+st.name, "dramanager")
	return err
}

// settled waits, up to cfg.Converge, for the claim to be prepared for pod
// or fully rolled back, with no intent unsettled, and says which; or
// "stranded" and why not.
func (s *intentsState) settled(ctx context.Context, claim, uid, pod string) (outcome, why string) {
	deadline := time.Now().Add(s.h.cfg.Converge)
	for {
		outcome, why = s.look(ctx, claim, uid, pod)
		if outcome != "" || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if outcome == "" {
		outcome = "stranded"
	}
	return outcome, why
}

// look says where the claim stands once: prepared, rolled back, or
// neither ("") and why.
func (s *intentsState) look(ctx context.Context, claim, uid, pod string) (outcome, why string) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := s.operator.ResourceV1().ResourceClaims("default").Get(lctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", err.Error()
	}
	state, err := s.recorded(lctx, uid)
	if err != nil {
		return "", err.Error()
	}
	intents, err := s.intents(lctx)
	if err != nil {
		return "", err.Error()
	}
	s.mu.Lock()
	held := s.prepared[uid]
	s.mu.Unlock()
	var reserved []string
	for _, r := range c.Status.ReservedFor {
		reserved = append(reserved, string(r.UID))
	}
	marked := c.Annotations[allocatedByAnnotation] != ""
	why = fmt.Sprintf("%v intents unsettled; driver holds it prepared: %v; nodeplug's state %s; allocated %v, marked %v, reserved for %v",
		intents, held, state, c.Status.Allocation != nil, marked, reserved)
	switch {
	case intents != 0:
	case held && state == dmv1.ClaimState_CLAIM_STATE_PREPARED && c.Status.Allocation != nil && slices.Equal(reserved, []string{pod}):
		return outcomePrepared, why
	case !held && state != dmv1.ClaimState_CLAIM_STATE_PREPARED && state != dmv1.ClaimState_CLAIM_STATE_UNPREPARING &&
		c.Status.Allocation == nil && len(reserved) == 0 && !marked:
		return outcomeRolledBack, why
	}
	return "", why
}

// recorded is nodeplug's state of claim uid, as ListClaims says.
func (s *intentsState) recorded(ctx context.Context, uid string) (dmv1.ClaimState, error) {
	l, err := s.dra.ListClaims(ctx, &dmv1.ListClaimsRequest{Namespace: "default"})
	if err != nil {
		return 0, fmt.Errorf("ListClaims: %w", err)
	}
	for _, c := range l.GetClaims() {
		if c.GetUid() == uid {
			return c.GetState(), nil
		}
	}
	return dmv1.ClaimState_CLAIM_STATE_UNSPECIFIED, nil
}

// intents reads the dramanager's nodeplug_dramanager_claim_intents.
func (s *intentsState) intents(ctx context.Context) (float64, error) {
	addr, err := s.h.st.Process("dramanager").Addr(ctx, "metrics listening")
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "nodeplug_dramanager_claim_intents "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, errors.Join(errors.New("nodeplug_dramanager_claim_intents not in the dramanager's metrics"), sc.Err())
}

// retry calls f until it succeeds, ctx ends, or cfg.Converge passed.
func (s *intentsState) retry(ctx context.Context, f func(context.Context) error) error {
	return retryFor(ctx, s.h.cfg.Converge, f, nil)
}
