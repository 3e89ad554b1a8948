package podworker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/podworker"
)

// TestPodEvictedByNoExecuteTaint: a DeviceTaintRule tainting the
// driver's devices NoExecute evicts the running pod whose claim does not
// tolerate it — a DeviceTaintManagerEviction event, then the pod deleted
// and its claim unprepared — and leaves the pods whose claims tolerate it
// for ever, or for an hour from the taint's time.
func TestPodEvictedByNoExecuteTaint(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tolerating := func(name string, seconds *int64) *resourcev1.ResourceClaimTemplate {
		tpl := template("default", name, "gpu")
		tpl.Spec.Spec.Devices.Requests[0].Exactly.Tolerations = []resourcev1.DeviceToleration{{
			Key: "example.com/broken", Operator: resourcev1.DeviceTolerationOpExists,
			Effect: resourcev1.DeviceTaintEffectNoExecute, TolerationSeconds: seconds}}
		return tpl
	}
	e.create(template("default", "plain", "gpu"), tolerating("forever", nil), tolerating("an-hour", ptr.To[int64](3600)),
		pod("default", "z-victim", "plain", ""), pod("default", "tolerant", "forever", ""), pod("default", "patient", "an-hour", ""))
	claims := map[string]*resourcev1.ResourceClaim{}
	for _, name := range []string{"z-victim", "tolerant", "patient"} {
		testutil.Eventually(t, name+" prepared", func() error {
			p := e.pod("default", name)
			if c := scheduled(p); c == nil || c.Status != corev1.ConditionTrue {
				return fmt.Errorf("scheduled %+v", c)
			}
			c, err := e.claim("default", *p.Status.ResourceClaimStatuses[0].ResourceClaimName)
			claims[name] = c
			return err
		})
	}
	rule := &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "broken"}, Spec: resourcev1.DeviceTaintRuleSpec{
		DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: ptr.To(gpu)},
		Taint:          resourcev1.DeviceTaint{Key: "example.com/broken", Value: "fan", Effect: resourcev1.DeviceTaintEffectNoExecute},
	}}
	if _, err := e.api.Client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "victim evicted and its claim unprepared", func() error {
		ev := e.events("default", "z-victim")
		if m := ev[podworker.ReasonTaintEviction]; !strings.Contains(m, "example.com/broken=fan:NoExecute") {
			return fmt.Errorf("no eviction event naming the taint: %v", ev)
		}
		if _, err := e.api.Client.CoreV1().Pods("default").Get(ctx, "z-victim", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("victim not deleted: %v", err)
		}
		if _, unprepared := e.plugin.Calls(claims["z-victim"].UID); unprepared == 0 {
			return errors.New("victim's claim not unprepared")
		}
		return nil
	})
	// A look at the taints decides for every pod before it evicts any,
	// by name: a tolerating pod to be evicted would have gone before the
	// victim (z-…).
	for _, name := range []string{"tolerant", "patient"} {
		p := e.pod("default", name)
		if p.DeletionTimestamp != nil || e.events("default", name)[podworker.ReasonTaintEviction] != "" {
			t.Errorf("pod %s, whose claim tolerates the taint, was evicted", name)
		}
		if _, unprepared := e.plugin.Calls(claims[name].UID); unprepared != 0 {
			t.Errorf("claim of pod %s unprepared", name)
		}
	}
}
