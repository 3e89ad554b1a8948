package drivers

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubeaccess"
)

// Why a driver's slices are deleted (the reason label of the metrics).
const (
	reasonDisconnected = "disconnected" // no instance stayed connected
	reasonAbsent       = "absent"       // not registered again after a start
)

// wipe is a pending (or finished) deletion of one driver's slices.
type wipe struct {
	at     time.Time
	reason string
	timer  *time.Timer
	cancel context.CancelFunc // ends a deletion in progress
	done   bool               // finished; kept so a disconnected driver is not swept again and again
}

func (w *wipe) stop() {
	w.timer.Stop()
	w.cancel()
}

// syncLocked brings driver's pending deletion in line with its instances:
// none while one is connected; else one, due DisconnectDelay after the
// driver was last seen usable. Called with r.mu held after any change.
func (r *Registry) syncLocked(driver string) {
	r.metrics.setInstances(driver, r.drivers[driver])
	if r.cfg.Client == nil || r.closed {
		return
	}
	if r.usableLocked(driver) {
		if w := r.wipes[driver]; w != nil {
			w.stop()
			delete(r.wipes, driver)
			if !w.done {
				r.log.Debug("DRA driver connected: its ResourceSlices are kept", "driver", driver)
			}
		}
		return
	}
	if r.wipes[driver] == nil {
		r.scheduleLocked(driver, reasonDisconnected)
	}
}

// scheduleLocked arranges for driver's slices on this node to be deleted
// after DisconnectDelay unless an instance connects before.
func (r *Registry) scheduleLocked(driver, reason string) {
	ctx, cancel := context.WithCancel(r.ctx)
	w := &wipe{at: r.now().Add(r.cfg.DisconnectDelay), reason: reason, cancel: cancel}
	w.timer = time.AfterFunc(r.cfg.DisconnectDelay, func() { r.runWipe(ctx, driver, w) })
	r.wipes[driver] = w
	r.log.Debug("DRA driver has no connected instance: its ResourceSlices will be deleted unless one connects",
		"driver", driver, "reason", reason, "delay", r.cfg.DisconnectDelay.String())
}

func (r *Registry) runWipe(ctx context.Context, driver string, w *wipe) {
	r.mu.Lock()
	if r.closed || r.wipes[driver] != w {
		r.mu.Unlock()
		return
	}
	r.wg.Add(1)
	r.mu.Unlock()
	defer r.wg.Done()
	r.deleteSlices(ctx, driver, w.reason)
	r.mu.Lock()
	if r.wipes[driver] == w {
		if len(r.drivers[driver]) == 0 {
			delete(r.wipes, driver)
		} else {
			w.done = true
		}
	}
	r.mu.Unlock()
}

// wipeBackoff is the kubelet's, for a deletion the API refuses; it holds
// at its cap (DelayFunc().Until) and never gives up: a deletion refused
// for want of a permission succeeds once it is granted.
var wipeBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Cap: 5 * time.Minute, Steps: 100}

// deleteSlices deletes driver's ResourceSlices on this node with one
// DeleteCollection (field selector spec.nodeName, spec.driver, as the
// kubelet), retried with backoff until it succeeds or ctx ends (the driver
// connected again, or the registry closed). With Config.Slices, a driver
// the listed cache holds no slice of is left at that: there is nothing to
// delete, as far as a List made a moment later could tell.
func (r *Registry) deleteSlices(ctx context.Context, driver, reason string) {
	sel := fields.Set{resourceapi.ResourceSliceSelectorNodeName: r.cfg.NodeName, resourceapi.ResourceSliceSelectorDriver: driver}.String()
	slices := r.cfg.Client.ResourceV1().ResourceSlices()
	_ = wipeBackoff.DelayFunc().Until(ctx, true, true, func(ctx context.Context) (bool, error) {
		n := -1 // unknown
		if r.cfg.Slices != nil {
			if c, ok := r.cfg.Slices(driver); ok {
				n = c
			}
		}
		if n == 0 {
			r.metrics.deleted(driver, reason, 0)
			r.log.Debug("a DRA driver with no connected instance has no ResourceSlices on this node: nothing to delete", "driver", driver, "reason", reason)
			return true, nil
		}
		if n < 0 {
			if list, err := slices.List(ctx, metav1.ListOptions{FieldSelector: sel}); err == nil {
				n = len(list.Items)
			}
		}
		err := slices.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel})
		switch {
		case err == nil, apierrors.IsNotFound(err):
			r.metrics.deleted(driver, reason, n)
			r.log.Info("deleted the ResourceSlices of a DRA driver with no connected instance", "driver", driver, "reason", reason, "field_selector", sel, "slices", n)
			return true, nil
		case ctx.Err() != nil:
			return false, ctx.Err()
		default:
			if denied := kubeaccess.Denied(err, r.cfg.Identity); denied != nil {
				err = denied
			}
			r.log.Warn("deleting the ResourceSlices of a DRA driver failed; retrying", "driver", driver, "field_selector", sel, "error", err)
			return false, nil
		}
	})
}

// Start begins the sweep after a start: the drivers that have slices on
// this node are given DisconnectDelay to register (again) and connect;
// the slices of those that do not are deleted then. Listing retries with
// backoff until the API answers or the registry closes.
func (r *Registry) Start() {
	if r.cfg.Client == nil {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		sel := fields.Set{resourceapi.ResourceSliceSelectorNodeName: r.cfg.NodeName}.String()
		var drivers map[string]bool
		_ = wipeBackoff.DelayFunc().Until(r.ctx, true, true, func(ctx context.Context) (bool, error) {
			list, err := r.cfg.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
			if err != nil {
				if ctx.Err() != nil {
					return false, ctx.Err()
				}
				if denied := kubeaccess.Denied(err, r.cfg.Identity); denied != nil {
					err = denied
				}
				r.log.Warn("listing this node's ResourceSlices at start failed; retrying", "field_selector", sel, "error", err)
				return false, nil
			}
			drivers = map[string]bool{}
			for i := range list.Items {
				drivers[list.Items[i].Spec.Driver] = true
			}
			return true, nil
		})
		r.mu.Lock()
		defer r.mu.Unlock()
		for d := range drivers {
			if r.closed || r.usableLocked(d) || r.wipes[d] != nil {
				continue
			}
			r.scheduleLocked(d, reasonAbsent)
		}
	}()
}
