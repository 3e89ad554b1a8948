package claimalloc

import (
	"context"
	"slices"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubecache"
)

// DeviceTaintRules taint the devices they select: a device a NoSchedule
// rule selects is not allocated unless the request tolerates the taint;
// a rule of effect None changes nothing; without FollowTaintRules the
// rules are not read. Both with decisions listing from the API and with
// the informers of a kubecache that follows the rules.
func TestDeviceTaintRules(t *testing.T) {
	for _, informers := range []bool{false, true} {
		name := "listed"
		if informers {
			name = "informers"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			a := startAPI(t, testutil.TempDir(t))
			al, err := New(a.Client, a.NodeName, nil)
			if err != nil {
				t.Fatal(err)
			}
			al.FollowTaintRules()
			var kc *kubecache.Cache
			if informers {
				if kc, err = kubecache.New(a.Client, a.NodeName, kubecache.WithTaintRules()); err != nil {
					t.Fatal(err)
				}
				kctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- kc.Run(kctx) }()
				t.Cleanup(func() {
					cancel()
					if err := <-done; err != nil {
						t.Errorf("kubecache: %v", err)
					}
				})
				al.Follow(kc)
				runAllocator(t, al)
			}
			e := &env{t: t, client: a.Client, alloc: al, stop: a.Stop}
			e.class(gpu, gpu)
			e.slice(gpu, testNode, "a100", "gpu-0", "gpu-1")
			rule := func(name string, effect resourcev1.DeviceTaintEffect, device *string) {
				r := &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.DeviceTaintRuleSpec{
					DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: ptr.To(gpu), Device: device},
					Taint:          resourcev1.DeviceTaint{Key: "example.com/" + name, Effect: effect},
				}}
				if _, err := a.Client.ResourceV1().DeviceTaintRules().Create(ctx, r, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				if kc != nil {
					testutil.WaitFor(t, "the rule in the informer", func() bool {
						_, ok, _ := kc.TaintRules.GetStore().GetByKey(name)
						return ok
					})
				}
			}
			rule("info", resourcev1.DeviceTaintEffectNone, nil)
			rule("broken", resourcev1.DeviceTaintEffectNoSchedule, ptr.To("gpu-0"))
			c, err := al.Reserve(ctx, pod("p"), e.claim("one", req("gpu", gpu, 1)))
			if err != nil || !slices.Equal(devicesOf(c), []string{gpu + "/" + testNode + "-a100/gpu-1"}) {
				t.Fatalf("with gpu-0 tainted: %v %v, want gpu-1", devicesOf(c), err)
			}
			_, err = al.Reserve(ctx, pod("q"), e.claim("another", req("gpu", gpu, 1)))
			isErr(t, "the only untainted device in use", err, errdefs.ErrFailedPrecondition)
			if !strings.Contains(err.Error(), "1 tainted") {
				t.Fatalf("reason %q does not mention the taint", err)
			}
			tolerant := req("gpu", gpu, 1)
			tolerant.Exactly.Tolerations = []resourcev1.DeviceToleration{{Key: "example.com/broken", Operator: resourcev1.DeviceTolerationOpExists}}
			c, err = al.Reserve(ctx, pod("r"), e.claim("tolerant", tolerant))
			if err != nil || !slices.Equal(devicesOf(c), []string{gpu + "/" + testNode + "-a100/gpu-0"}) {
				t.Fatalf("a request tolerating the rule's taint: %v %v", devicesOf(c), err)
			}
		})
	}
}
