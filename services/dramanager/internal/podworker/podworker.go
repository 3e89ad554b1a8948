// Package podworker does for the Pods of the node-local resource API what
// a cluster's control plane and the kubelet do for a pod's devices on one
// node. For each Pod it:
//
//   - makes the pod's ResourceClaims from their ResourceClaimTemplates as
//     the resourceclaim controller makes them (a generated name, the pod as
//     controlling owner, the pod-claim-name annotation) and records them in
//     the pod's status.resourceClaimStatuses;
//   - has the pod's claims allocated, reserved for it and prepared by their
//     drivers (the claims manager, through the view), retrying with backoff;
//   - binds the pod to the node (spec.nodeName) once its devices are
//     prepared, and writes its conditions and its containers' states;
//   - records an Event for each step and each refusal, with the reason;
//   - when the pod is deleted or has ended, releases its claims (they are
//     unprepared once no pod uses them) and deletes the claims made for it.
//
// The pods it prepared are recorded in a file before their claims are
// prepared, so a pod deleted while the dramanager was down is released at
// its next start.
package podworker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimalloc"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/internal/containers"
)

// PodClaimNameAnnotation names, on a claim made from a template, the pod
// claim it was made for (the resourceclaim controller's annotation).
const PodClaimNameAnnotation = "resource.kubernetes.io/pod-claim-name"

// Component is the source of the Events the worker records.
const Component = "nodeplug-dramanager"

// Event reasons, the kubelet's and the scheduler's where they have one.
const (
	ReasonScheduled            = "Scheduled"
	ReasonFailedScheduling     = "FailedScheduling"
	ReasonFailedClaimCreation  = "FailedResourceClaimCreation"
	ReasonFailedPrepare        = "FailedPrepareDynamicResources"
	ReasonPrepared             = "PreparedDynamicResources"
	ReasonUnsupportedField     = "UnsupportedField"
	ReasonFailedRelease        = "FailedReleaseDynamicResources"
	ReasonNoContainerRuntime   = "NoContainerRuntime"
	noRuntimeMessage           = "its devices are prepared; nodeplug runs no container runtime for it: `nodeplugctl start` prints what a runtime would be given"
	defaultRetryInitial        = time.Second
	defaultRetryMax            = 2 * time.Minute
	defaultWorkers             = 4
	eventCorrelatorBurstPerPod = 25
)

// Claims is what the worker asks of the claims side: the view of the
// claims manager (claimview.View).
type Claims interface {
	// Prepare allocates, reserves and prepares the pod's claims and
	// returns what each container gets.
	Prepare(ctx context.Context, req claims.PrepareRequest) ([]claims.ContainerResult, error)
	// ReleasePod releases every claim the pod holds.
	ReleasePod(ctx context.Context, podUID string) (int, error)
	// Holds says whether a claim is still recorded, prepared or being
	// unprepared by its driver.
	Holds(claimUID string) bool
}

// unpreparedPoll is how often a released pod's claims are looked at until
// their drivers unprepared them.
const unpreparedPoll = 100 * time.Millisecond

// Config configures a Worker.
type Config struct {
	Client kubernetes.Interface
	// Node is this node: the worker takes the pods bound to it and those
	// bound to none.
	Node   string
	Claims Claims
	// StateFile records the pods whose claims the worker prepared.
	StateFile string
	Log       *slog.Logger
	// RetryInitial and RetryMax bound the backoff of a pod that failed
	// (1 s and 2 min by default).
	RetryInitial, RetryMax time.Duration
	// Workers is how many pods are worked on at once (4 by default).
	Workers int
	// Devices allocates the pods' device-plugin resources and answers
	// their containers' starts (the devicemanager); nil: the pods'
	// device-plugin limits are not allocated (a warning event says so).
	Devices Devices
	// Runtime runs the pods' containers; nil: none does, and the pods'
	// containers wait with reason NoContainerRuntime once their devices
	// are prepared.
	Runtime containers.Runtime
	// RootDir is nodeplug's root directory: the containers' logs are
	// written under it (podlogs.Dir).
	RootDir string
	// Taints gives the NoExecute taints of the node's devices: the pods
	// whose claims' devices carry one they do not tolerate are evicted
	// (deleted), looked at every EvictionInterval (1 s by default). nil:
	// no pod is evicted.
	Taints           Taints
	EvictionInterval time.Duration
}

// Worker runs the pods of one node.
type Worker struct {
	cfg      Config
	log      *slog.Logger
	state    *state
	pods     cache.SharedIndexInformer
	factory  informers.SharedInformerFactory
	queue    workqueue.TypedRateLimitingInterface[string]
	events   record.EventBroadcaster
	recorder record.EventRecorder

	// ctrs is the runtime's containers as last listed.
	ctrs containerList

	mu sync.Mutex
	// prepared are the pods (by UID) whose devices are prepared and whose
	// status says so (a pod's claims cannot change once it is created);
	// warned those told of unsupported fields.
	prepared map[types.UID]*preparedPod
	warned   map[types.UID]bool
}

// preparedPod is what a pod's prepare gave.
type preparedPod struct {
	// cdi are each container's CDI devices.
	cdi map[string][]string
	// claims are the names of the claims holding each device (the
	// devices a NoExecute taint may evict the pod from).
	claims map[claimalloc.DeviceKey][]string
}

// preparedFrom is what results give.
func preparedFrom(results []claims.ContainerResult) *preparedPod {
	p := &preparedPod{cdi: map[string][]string{}, claims: map[claimalloc.DeviceKey][]string{}}
	for _, r := range results {
		p.cdi[r.Container] = r.CDIDeviceIDs
		for _, d := range r.Devices {
			k := claimalloc.DeviceKey{Driver: d.Driver, Pool: d.Pool, Device: d.Device.Device}
			if !slices.Contains(p.claims[k], d.Claim.Name) {
				p.claims[k] = append(p.claims[k], d.Claim.Name)
			}
		}
	}
	return p
}

// New makes a worker; Run runs it.
func New(cfg Config) (*Worker, error) {
	if cfg.Client == nil || cfg.Node == "" || cfg.Claims == nil || cfg.StateFile == "" {
		return nil, fmt.Errorf("pod worker: a client, a node, the claims and a state file are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Runtime != nil && cfg.RootDir == "" {
		return nil, fmt.Errorf("pod worker: a container runtime needs the root directory for its logs: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.RetryInitial <= 0 {
		cfg.RetryInitial = defaultRetryInitial
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = defaultRetryMax
	}
	if cfg.Workers <= 0 {
		cfg.Workers = defaultWorkers
	}
	if cfg.EvictionInterval <= 0 {
		cfg.EvictionInterval = defaultEvictionInterval
	}
	st, err := loadState(cfg.StateFile)
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, log: cfg.Log.With("component", "podworker"), state: st,
		prepared: map[types.UID]*preparedPod{}, warned: map[types.UID]bool{}}
	w.factory = informers.NewSharedInformerFactory(cfg.Client, 0)
	w.pods = w.factory.Core().V1().Pods().Informer()
	w.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryInitial, cfg.RetryMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "pods"})
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			w.queue.Add(key)
		}
	}
	if _, err := w.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	}); err != nil {
		return nil, err
	}
	w.events = record.NewBroadcasterWithCorrelatorOptions(record.CorrelatorOptions{BurstSize: eventCorrelatorBurstPerPod})
	w.recorder = w.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component, Host: cfg.Node})
	return w, nil
}

// Run works until ctx ends. Pods recorded as prepared that no longer
// exist are released first.
func (w *Worker) Run(ctx context.Context) error {
	w.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: w.cfg.Client.CoreV1().Events("")})
	defer w.events.Shutdown()
	defer w.queue.ShutDown()
	w.factory.Start(ctx.Done())
	defer w.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), w.pods.HasSynced) {
		return nil
	}
	for uid, ref := range w.state.all() {
		if !w.exists(uid) {
			w.queue.Add(ref.key())
		}
	}
	var wg sync.WaitGroup
	if w.cfg.Taints != nil {
		wg.Go(func() { w.evictLoop(ctx) })
	}
	for range w.cfg.Workers {
		wg.Go(func() {
			for w.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	w.queue.ShutDown()
	wg.Wait()
	return nil
}

func (w *Worker) next(ctx context.Context) bool {
	key, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(key)
	err := w.sync(ctx, key)
	var later requeue
	if errors.As(err, &later) {
		w.queue.Forget(key)
		w.queue.AddAfter(key, time.Duration(later))
		return true
	}
	if err != nil {
		if ctx.Err() == nil {
			w.log.Info("pod not done; retrying", "pod", key, "error", err)
		}
		w.queue.AddRateLimited(key)
		return true
	}
	w.queue.Forget(key)
	return true
}

// exists says whether the informer holds a pod of that UID.
func (w *Worker) exists(uid types.UID) bool {
	for _, o := range w.pods.GetStore().List() {
		if o.(*corev1.Pod).UID == uid {
			return true
		}
	}
	return false
}

// sync brings one pod (namespace/name) to where it should be: released
// when gone or ended, prepared otherwise. Pods of that name recorded
// under another UID (deleted and created again) are released.
func (w *Worker) sync(ctx context.Context, key string) error {
	obj, exists, err := w.pods.GetStore().GetByKey(key)
	if err != nil {
		return err
	}
	var pod *corev1.Pod
	if exists {
		pod = obj.(*corev1.Pod)
	}
	for uid, ref := range w.state.all() {
		if ref.key() == key && (pod == nil || pod.UID != uid) {
			if err := w.release(ctx, uid, ref, nil); err != nil {
				return err
			}
		}
	}
	switch {
	case pod == nil:
		return nil
	case pod.Spec.NodeName != "" && pod.Spec.NodeName != w.cfg.Node:
		return nil
	case pod.DeletionTimestamp != nil, pod.Status.Phase == corev1.PodSucceeded, pod.Status.Phase == corev1.PodFailed:
		if ref, ok := w.state.get(pod.UID); ok && !ref.Ended {
			return w.release(ctx, pod.UID, ref, pod)
		}
		return nil
	}
	return w.run(ctx, pod)
}

// run prepares the pod's devices, binds it and writes its status, then
// runs its containers when there is a runtime.
func (w *Worker) run(ctx context.Context, pod *corev1.Pod) error {
	w.mu.Lock()
	prepared, done := w.prepared[pod.UID]
	w.mu.Unlock()
	if !done {
		var err error
		if prepared, err = w.prepare(ctx, pod); err != nil {
			return err
		}
	}
	if w.cfg.Runtime == nil {
		return nil
	}
	return w.syncContainers(ctx, pod, prepared.cdi)
}

// grace is how long the pod's containers are given to stop.
func grace(pod *corev1.Pod) int64 {
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return *g
	}
	return corev1.DefaultTerminationGracePeriodSeconds
}

// prepare prepares the pod's devices, binds it and writes its status; it
// returns what the prepare gave.
func (w *Worker) prepare(ctx context.Context, pod *corev1.Pod) (*preparedPod, error) {
	// A pod already bound and scheduled was run before a restart: its
	// prepare is the saved answer, and its events were recorded then.
	ranBefore := pod.Spec.NodeName != "" && conditionTrue(pod, corev1.PodScheduled)
	podClaims, err := w.podClaims(ctx, pod)
	if err != nil {
		return nil, err
	}
	ext, err := w.extendedClaimOf(ctx, pod)
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, errdefs.ErrFailedPrecondition) {
			w.unschedulable(ctx, pod, ReasonFailedScheduling, err)
		}
		return nil, err
	}
	// What the extended-resource claim does not serve is the device
	// plugins'.
	dpPod := ext.devicePluginPod(pod)
	if !ranBefore {
		w.warnUnsupported(dpPod)
	}
	req := claims.PrepareRequest{Pod: claims.PodRef{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}, PodClaims: podClaims}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			cc := claims.ContainerClaims{Container: c.Name}
			for _, rc := range c.Resources.Claims {
				cc.Claims = append(cc.Claims, claims.ContainerClaim{Name: rc.Name, Request: rc.Request})
			}
			req.Containers = append(req.Containers, cc)
		}
	}
	if ext != nil {
		ext.addTo(pod, &req)
	}
	ref := podRef{Namespace: pod.Namespace, Name: pod.Name, Grace: grace(pod), Devices: w.cfg.Devices != nil && hasDevicePluginLimits(dpPod)}
	if err := w.state.add(pod.UID, ref); err != nil {
		return nil, err
	}
	var results []claims.ContainerResult
	if len(req.PodClaims) > 0 {
		results, err = w.cfg.Claims.Prepare(ctx, req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			w.recorder.Event(pod, corev1.EventTypeWarning, ReasonFailedPrepare, message(err.Error()))
			if errors.Is(err, errdefs.ErrFailedPrecondition) {
				w.unschedulable(ctx, pod, ReasonFailedScheduling, err)
			}
			return nil, err
		}
	}
	if ref.Devices {
		if err := w.allocateDevices(ctx, dpPod); err != nil {
			if ctx.Err() == nil {
				w.unschedulable(ctx, pod, ReasonAdmissionError, err)
			}
			return nil, err
		}
	}
	if pod.Spec.NodeName == "" {
		if err := w.bind(ctx, pod); err != nil {
			return nil, err
		}
		w.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonScheduled, "Successfully assigned %s/%s to %s", pod.Namespace, pod.Name, w.cfg.Node)
	}
	if len(req.PodClaims) > 0 && !ranBefore {
		w.recorder.Event(pod, corev1.EventTypeNormal, ReasonPrepared, preparedMessage(results))
	}
	if err := w.setScheduled(ctx, pod, corev1.ConditionTrue, "", "", w.cfg.Runtime == nil); err != nil {
		return nil, err
	}
	prepared := preparedFrom(results)
	w.mu.Lock()
	w.prepared[pod.UID] = prepared
	w.mu.Unlock()
	return prepared, nil
}

// unschedulable records a warning event (reason) with err and writes the
// pod's PodScheduled condition False/Unschedulable with it.
func (w *Worker) unschedulable(ctx context.Context, pod *corev1.Pod, reason string, err error) {
	msg := message(err.Error())
	w.recorder.Event(pod, corev1.EventTypeWarning, reason, msg)
	if serr := w.setScheduled(ctx, pod, corev1.ConditionFalse, corev1.PodReasonUnschedulable, msg, false); serr != nil {
		w.log.Warn("pod status not written", "pod", pod.Namespace+"/"+pod.Name, "error", serr)
	}
}

// maxMessage bounds an event's or a condition's message: an allocator's
// reason on a large node can be long, and the API keeps events of at most
// 16 KiB.
const maxMessage = 4096

// message is s, valid UTF-8, cut to maxMessage bytes (on a rune boundary)
// with the length it had.
func message(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes in all)", s[:cut], len(s))
}

// preparedMessage names the CDI devices each container gets.
func preparedMessage(results []claims.ContainerResult) string {
	var parts []string
	for _, r := range results {
		if len(r.CDIDeviceIDs) > 0 {
			parts = append(parts, fmt.Sprintf("%s: %s", r.Container, strings.Join(r.CDIDeviceIDs, ", ")))
		}
	}
	if len(parts) == 0 {
		return "the pod's claims are prepared"
	}
	return message("the pod's claims are prepared; CDI devices " + strings.Join(parts, "; "))
}

// release releases the pod's claims, deletes the claims made for it and
// forgets it. pod is the pod when it still exists (ended), for events.
func (w *Worker) release(ctx context.Context, uid types.UID, ref podRef, pod *corev1.Pod) error {
	// The containers are stopped before their devices are unprepared.
	// Those of a pod that ended stay, with their logs, until it is
	// deleted.
	if w.cfg.Runtime != nil && (pod == nil || pod.DeletionTimestamp != nil) {
		if err := w.stopContainers(ctx, uid, ref, pod); err != nil {
			return err
		}
	}
	if ref.Devices && w.cfg.Devices != nil {
		if err := w.cfg.Devices.Release(ctx, string(uid)); err != nil {
			if pod != nil {
				w.recorder.Event(pod, corev1.EventTypeWarning, ReasonFailedRelease, message(err.Error()))
			}
			return fmt.Errorf("releasing the devices of pod %s (%s): %w", ref.key(), uid, err)
		}
	}
	if _, err := w.cfg.Claims.ReleasePod(ctx, string(uid)); err != nil {
		if pod != nil {
			w.recorder.Event(pod, corev1.EventTypeWarning, ReasonFailedRelease, message(err.Error()))
		}
		return fmt.Errorf("releasing the claims of pod %s (%s): %w", ref.key(), uid, err)
	}
	api := w.cfg.Client.ResourceV1().ResourceClaims(ref.Namespace)
	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing the claims of namespace %s: %w", ref.Namespace, err)
	}
	for _, c := range list.Items {
		if !ownedBy(&c, uid) {
			continue
		}
		// A claim made for the pod is deleted once its driver unprepared
		// it: deleted before, its devices would look free to the
		// allocator while the driver still holds them prepared.
		if w.cfg.Claims.Holds(string(c.UID)) {
			// Not a failure: looked at again after unpreparedPoll.
			return fmt.Errorf("claim %s/%s made for the pod is still being unprepared: %w", c.Namespace, c.Name, requeue(unpreparedPoll))
		}
		err := api.Delete(ctx, c.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &c.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting claim %s/%s made for pod %s: %w", c.Namespace, c.Name, ref.key(), err)
		}
	}
	if pod != nil && pod.DeletionTimestamp == nil && w.cfg.Runtime != nil {
		// Ended: its containers are removed when it is deleted.
		ref.Ended = true
		if err := w.state.add(uid, ref); err != nil {
			return err
		}
	} else if err := w.state.remove(uid); err != nil {
		return err
	}
	w.mu.Lock()
	delete(w.prepared, uid)
	delete(w.warned, uid)
	w.mu.Unlock()
	w.log.Info("pod released", "pod", ref.key(), "uid", uid)
	return nil
}
