package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The pods phase's invariants, beside (g), (i) and (j), which its driver
// checks as the claims phase's does (a pod's prepare is acknowledged once
// the pod is seen bound):
//
//	(m) every Pod created is run: within cfg.Converge it is bound to the
//	    node with PodScheduled True, and exactly one claim was made from
//	    its template for it, which the driver holds prepared;
//	(n) nothing of a deleted Pod is left: within cfg.Converge the claim
//	    made for it is deleted and its driver holds it unprepared.
const (
	invPodRun  = "m"
	invPodLeft = "n"
)

// podsDriverName is the pods phase's DRA driver; its DeviceClass and the
// phase's ResourceClaimTemplate have its name.
const podsDriverName = "pods.chaos.nodeplug.test"

// podKillTargets are killed in turn: the pod worker's process and the API
// it reads and writes the pods through.
var podKillTargets = []string{"dramanager", "apiserver"}

// PodsResults are the pods phase's figures.
type PodsResults struct {
	Workers int `json:"workers"`
	Kills   int `json:"kills"`
	// Run counts the pods seen bound with their claim prepared, Deleted
	// those whose claim was then seen deleted and unprepared.
	Run     int `json:"pods_run"`
	Deleted int `json:"pods_deleted"`
	Retried int `json:"retried_calls"`
	// DriverPrepares and DriverUnprepares count the claims the driver was
	// asked to prepare and unprepare.
	DriverPrepares   int `json:"driver_prepares"`
	DriverUnprepares int `json:"driver_unprepares"`
}

// podsPhase runs cfg.PodWorkers clients, each creating a Pod whose claim
// comes from a ResourceClaimTemplate, waiting for it to run, deleting it
// and waiting for its claim to go, while the dramanager and
// nodeplug-apiserver are killed in turn cfg.PodKills times.
func (h *harness) podsPhase(ctx context.Context) error {
	if h.cfg.PodWorkers == 0 {
		return nil
	}
	h.logf("pods: %d clients creating and deleting pods, %d kills of the dramanager and nodeplug-apiserver in turn", h.cfg.PodWorkers, h.cfg.PodKills)
	s := &claimsState{h: h, driver: podsDriverName, acked: map[string]bool{}, inUse: map[string]int{}, released: map[string]string{}, prepared: map[string][]string{}, names: map[string]string{}}
	p := &podsState{claimsState: s}
	p.res.Workers = h.cfg.PodWorkers
	defer func() {
		p.mu.Lock()
		res := p.res
		res.Retried = s.res.Retried
		res.DriverPrepares, res.DriverUnprepares = s.res.DriverPrepares, s.res.DriverUnprepares
		p.mu.Unlock()
		h.mu.Lock()
		h.res.Pods = res
		h.mu.Unlock()
	}()
	d, err := h.startClaimDriver(ctx, podsDriverName, claimsPlugin{s}, claimsDevices)
	if err != nil {
		return fmt.Errorf("pods: %w", err)
	}
	defer d.stop()
	s.operator, s.dra = d.operator, d.dra
	if err := s.retry(ctx, "create the template", func(cctx context.Context) error {
		_, err := s.operator.ResourceV1().ResourceClaimTemplates("default").Create(cctx, &resourcev1.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: podsDriverName, Namespace: "default"},
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
				Requests: []resourcev1.DeviceRequest{{Name: "dev", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: podsDriverName}}},
			}}},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}); err != nil {
		return fmt.Errorf("pods: %w", err)
	}

	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errc := make(chan error, h.cfg.PodWorkers)
	for w := range h.cfg.PodWorkers {
		wg.Go(func() {
			if err := p.work(wctx, w); err != nil && wctx.Err() == nil {
				errc <- err
			}
		})
	}
	stop := func() { cancel(); wg.Wait() }
	defer stop()
	for i := range h.cfg.PodKills {
		before := p.run()
		if err := h.awaitKillMoment(ctx, errc, func() bool { return p.run() > before }, 50*time.Millisecond); err != nil {
			return err
		}
		svc := podKillTargets[i%len(podKillTargets)]
		if err := h.killRestart(ctx, svc); err != nil {
			return err
		}
		p.mu.Lock()
		p.res.Kills++
		p.mu.Unlock()
		if _, err := h.converge(ctx, fmt.Sprintf("pods kill %d (%s)", i+1, svc), svc); err != nil {
			return err
		}
	}
	stop()
	select {
	case err := <-errc:
		return err
	default:
	}
	return nil
}

// podsState is the pods phase's ledger beside the claims' one its driver
// keeps.
type podsState struct {
	*claimsState
	mu  sync.Mutex
	res PodsResults
}

func (p *podsState) run() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res.Run
}

// work is one client: a new Pod each round, waited for until it runs (m),
// deleted, and waited for until nothing of it is left (n), until ctx ends.
func (p *podsState) work(ctx context.Context, w int) error {
	s := p.claimsState
	pods := s.operator.CoreV1().Pods("default")
	for k := 0; ctx.Err() == nil; k++ {
		name := fmt.Sprintf("chaos-pod-w%d-%d", w, k)
		var pod *corev1.Pod
		if err := s.retry(ctx, "create pod "+name, func(cctx context.Context) error {
			created, err := pods.Create(cctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
				Spec: corev1.PodSpec{
					ResourceClaims: []corev1.PodResourceClaim{{Name: "dev", ResourceClaimTemplateName: ptr.To(podsDriverName)}},
					Containers: []corev1.Container{{Name: "main", Image: "example.com/chaos:1",
						Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}}}},
				},
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				created, err = pods.Get(cctx, name, metav1.GetOptions{})
			}
			pod = created
			return err
		}); err != nil {
			return err
		}
		claim, err := p.waitRun(ctx, pod)
		if err != nil || claim == nil {
			return err
		}
		uid := string(claim.UID)
		s.mu.Lock()
		s.acked[uid] = true
		s.inUse[uid] = 1
		s.mu.Unlock()
		p.mu.Lock()
		p.res.Run++
		p.mu.Unlock()

		s.mu.Lock()
		s.inUse[uid] = 0
		s.mu.Unlock()
		if err := s.retry(ctx, "delete pod "+name, func(cctx context.Context) error {
			err := pods.Delete(cctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}); err != nil {
			return err
		}
		s.mu.Lock()
		delete(s.acked, uid)
		delete(s.inUse, uid)
		s.released[uid] = "default/" + claim.Name
		s.mu.Unlock()
		if err := p.waitGone(ctx, name, claim); err != nil {
			return err
		}
		p.mu.Lock()
		p.res.Deleted++
		p.mu.Unlock()
	}
	return nil
}

// waitRun waits for (m): the pod bound and scheduled, one claim made for
// it, held prepared by the driver. It returns the claim; nil with a
// violation recorded when the wait ran out.
func (p *podsState) waitRun(ctx context.Context, pod *corev1.Pod) (*resourcev1.ResourceClaim, error) {
	s := p.claimsState
	var claim *resourcev1.ResourceClaim
	err := retryFor(ctx, s.h.cfg.Converge, func(cctx context.Context) error {
		cur, err := s.operator.CoreV1().Pods(pod.Namespace).Get(cctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.Spec.NodeName == "" || !podScheduled(cur) || len(cur.Status.ResourceClaimStatuses) != 1 || cur.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			return fmt.Errorf("not run yet: node %q, conditions %v, claim statuses %v", cur.Spec.NodeName, cur.Status.Conditions, cur.Status.ResourceClaimStatuses)
		}
		list, err := s.operator.ResourceV1().ResourceClaims(pod.Namespace).List(cctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var made []resourcev1.ResourceClaim
		for _, c := range list.Items {
			for _, o := range c.OwnerReferences {
				if o.UID == pod.UID {
					made = append(made, c)
				}
			}
		}
		if len(made) != 1 || made[0].Name != *cur.Status.ResourceClaimStatuses[0].ResourceClaimName {
			names := make([]string, 0, len(made))
			for _, c := range made {
				names = append(names, c.Name)
			}
			s.h.violate(Violation{Invariant: invPodRun, When: "pods: run",
				Detail: fmt.Sprintf("pod %s (%s) has claims %v made for it; its status names %s", pod.Name, pod.UID, names, *cur.Status.ResourceClaimStatuses[0].ResourceClaimName)})
			claim = nil
			return nil
		}
		s.mu.Lock()
		_, prepared := s.prepared[string(made[0].UID)]
		s.mu.Unlock()
		if !prepared {
			return fmt.Errorf("claim %s bound but not held prepared by the driver", made[0].Name)
		}
		claim = &made[0]
		return nil
	}, nil)
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		s.h.violate(Violation{Invariant: invPodRun, When: "pods: run",
			Detail: fmt.Sprintf("pod %s (%s) not run within %v: %v", pod.Name, pod.UID, s.h.cfg.Converge, err)})
		return nil, fmt.Errorf("pods: pod %s not run: %w", pod.Name, err)
	}
	return claim, nil
}

// waitGone waits for (n): the claim made for the deleted pod deleted and
// unprepared by its driver.
func (p *podsState) waitGone(ctx context.Context, pod string, claim *resourcev1.ResourceClaim) error {
	s := p.claimsState
	err := retryFor(ctx, s.h.cfg.Converge, func(cctx context.Context) error {
		_, err := s.operator.ResourceV1().ResourceClaims(claim.Namespace).Get(cctx, claim.Name, metav1.GetOptions{})
		switch {
		case err == nil:
			return fmt.Errorf("claim %s still there", claim.Name)
		case !apierrors.IsNotFound(err):
			return err
		}
		s.mu.Lock()
		_, prepared := s.prepared[string(claim.UID)]
		s.mu.Unlock()
		if prepared {
			return errors.New("the driver still holds its claim prepared")
		}
		return nil
	}, nil)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		s.h.violate(Violation{Invariant: invPodLeft, When: "pods: delete",
			Detail: fmt.Sprintf("deleted pod %s: %v after %v", pod, err, s.h.cfg.Converge)})
		return fmt.Errorf("pods: deleted pod %s: %w", pod, err)
	}
	return nil
}

func podScheduled(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
