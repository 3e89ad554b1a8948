package web

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/state"
	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/traces"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

func draSnapshot(devices ...*dmv1.Device) state.Snapshot {
	return state.Snapshot{
		Status: map[string]string{},
		DRADrivers: []*dmv1.DRADriver{{Name: "gpu.example.com", Instances: []*dmv1.DRADriverInstance{{
			DriverName: "gpu.example.com", Endpoint: "/var/lib/kubelet/plugins/gpu.example.com/dra.sock", Generation: "7",
			Service: "v1.DRAPlugin", Connected: true, ConnectionState: "READY", Serving: true, HealthService: true,
			HealthServiceName: "v1alpha1.DRAResourceHealth", RegisteredTime: timestamppb.New(time.Now().Add(-time.Minute)),
		}}}},
		Slices: []*dmv1.ResourceSlice{{
			Name: "node-1-gpu.example.com-abcde", Driver: "gpu.example.com", NodeName: "node-1", ResourceVersion: "12",
			Pool: &dmv1.ResourcePool{Name: "node-1", Generation: 2, ResourceSliceCount: 1}, Devices: devices,
		}},
	}
}

// TestDRAView: the DRA page shows each driver instance's connection, the
// slices with their devices' attributes and capacity, and the claims with
// their state and CDI IDs; a device published later reaches an open event
// stream; a devicemanager that does not serve ListClaims is said in words.
func TestDRAView(t *testing.T) {
	st := &snapshots{}
	snap := draSnapshot(&dmv1.Device{Name: "gpu-0", Attributes: map[string]string{"model": "m1", "index": "0"}, Capacity: map[string]string{"memory": "16Gi"}, Health: "Healthy"})
	snap.Claims = []*dmv1.Claim{{
		Namespace: "default", Name: "claim-a", Uid: "uid-a", State: dmv1.ClaimState_CLAIM_STATE_PREPARED, AllocatedHere: true,
		Pods:         []*dmv1.ClaimPod{{Uid: "pod-uid", Name: "web-0"}},
		Devices:      []*dmv1.ClaimDevice{{Driver: "gpu.example.com", Pool: "node-1", Device: "gpu-0", Requests: []string{"gpu"}, CdiDeviceIds: []string{"example.com/gpu=gpu-0"}}},
		CdiDeviceIds: []string{"example.com/gpu=gpu-0"},
	}}
	st.set(snap)
	srv, token := newTestServer(t, st, traces.NewStore(traces.Limits{}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	resp := get(t, ctx, srv.URL+"/dra", token)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /dra: status %d, %v", resp.StatusCode, err)
	}
	page := string(body)
	for _, want := range []string{
		`data-driver="gpu.example.com"`,
		`data-endpoint="/var/lib/kubelet/plugins/gpu.example.com/dra.sock" data-connected="true" data-serving="true"`,
		`READY`, `<code>v1.DRAPlugin</code>`, `<code>v1alpha1.DRAResourceHealth</code>`,
		`data-driver="gpu.example.com" data-pool="node-1" data-device="gpu-0" data-health="healthy"`,
		`<code>index</code>=0<br><code>model</code>=m1`, `<code>memory</code>=16Gi`,
		`data-claim="default/claim-a" data-state="prepared"`, `example.com/gpu=gpu-0`, `web-0 (pod-uid)`,
		`<a href="/dra" aria-current="page">DRA</a>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the DRA page lacks %s", want)
		}
	}
	if t.Failed() {
		t.Fatalf("page:\n%s", page)
	}

	events := get(t, ctx, srv.URL+"/events?view=dra", token)
	defer events.Body.Close()
	ch := readEvents(events.Body)
	if first := <-ch; !strings.Contains(first, `data-device="gpu-0"`) || strings.Contains(first, `data-device="gpu-1"`) {
		t.Fatalf("first event:\n%s", first)
	}
	next := draSnapshot(&dmv1.Device{Name: "gpu-0", Health: "Unhealthy", HealthMessage: "ECC errors"}, &dmv1.Device{Name: "gpu-1"})
	next.ClaimsProblem = "this devicemanager does not serve ListClaims"
	next.Status = map[string]string{state.DRA: "unreachable: connection refused"}
	st.set(next)
	select {
	case got := <-ch:
		for _, want := range []string{
			`data-device="gpu-0" data-health="unhealthy"`, `ECC errors`, `data-device="gpu-1" data-health="unknown"`,
			`Claims not shown: this devicemanager does not serve ListClaims.`,
			`data-service="dramanager">dramanager: unreachable: connection refused`,
		} {
			if !strings.Contains(got, want) {
				t.Errorf("the update lacks %s", want)
			}
		}
		if strings.Contains(got, `data-claim=`) {
			t.Error("the update still shows a claim while claims cannot be listed")
		}
		if t.Failed() {
			t.Fatalf("update:\n%s", got)
		}
	case <-ctx.Done():
		t.Fatal("no event after a device was published")
	}
}

// TestDRAViewEmpty: with nothing registered the page says how a driver
// gets there.
func TestDRAViewEmpty(t *testing.T) {
	v := draOf(state.Snapshot{Status: map[string]string{}}, time.Now(), "")
	frag, err := renderFragment("dra", v)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"No DRA driver registered", "No ResourceSlice on this node.", "No claim prepared on this node."} {
		if !strings.Contains(frag, want) {
			t.Errorf("the empty DRA view lacks %q:\n%s", want, frag)
		}
	}
}

func renderFragment(view string, data any) (string, error) {
	var b strings.Builder
	err := templates.ExecuteTemplate(&b, view, data)
	return b.String(), err
}
