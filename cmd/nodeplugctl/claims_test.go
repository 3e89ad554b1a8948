package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// The claims table; with --all it has the NODE each claim is allocated
// to. An empty list says whether it was this node's.
func TestRenderClaims(t *testing.T) {
	resp := &dmv1.ListClaimsResponse{Claims: []*dmv1.Claim{
		{Namespace: "default", Name: "gpu-claim", State: dmv1.ClaimState_CLAIM_STATE_PREPARED, AllocatedNode: "node-1",
			Devices: []*dmv1.ClaimDevice{{Driver: "gpu.example.com", Pool: "node-1", Device: "gpu-0", CdiDeviceIds: []string{"example.com/gpu=u1-gpu-0"},
				Health: "Unhealthy", HealthMessage: "ECC errors"}},
			Pods: []*dmv1.ClaimPod{{Uid: "uid-1", Name: "p1"}, {Uid: "uid-2"}}, CdiDeviceIds: []string{"example.com/gpu=u1-gpu-0"}},
		{Namespace: "default", Name: "waiting", State: dmv1.ClaimState_CLAIM_STATE_PENDING},
		{Namespace: "ns", Name: "bad", State: dmv1.ClaimState_CLAIM_STATE_FAILED, Reason: "no device fits"},
		{Namespace: "ns", Name: "theirs", State: dmv1.ClaimState_CLAIM_STATE_ALLOCATED, AllocatedNode: "node-2",
			Devices: []*dmv1.ClaimDevice{{Driver: "gpu.example.com", Pool: "node-2", Device: "gpu-1"}}, Reason: "allocated to node node-2, not this node (node-1)"},
	}}
	for _, tc := range []struct {
		all  bool
		resp *dmv1.ListClaimsResponse
		want string
	}{
		{false, resp, `CLAIM              STATE      DRIVER           DEVICES       HEALTH                        PODS      CDI IDS                   REASON
default/gpu-claim  prepared   gpu.example.com  node-1/gpu-0  gpu-0=Unhealthy (ECC errors)  p1,uid-2  example.com/gpu=u1-gpu-0  -
default/waiting    pending    -                -             -                             -         -                         -
ns/bad             failed     -                -             -                             -         -                         no device fits
ns/theirs          allocated  gpu.example.com  node-2/gpu-1  -                             -         -                         allocated to node node-2, not this node (node-1)
`},
		{true, resp, `CLAIM              STATE      NODE    DRIVER           DEVICES       HEALTH                        PODS      CDI IDS                   REASON
default/gpu-claim  prepared   node-1  gpu.example.com  node-1/gpu-0  gpu-0=Unhealthy (ECC errors)  p1,uid-2  example.com/gpu=u1-gpu-0  -
default/waiting    pending    -       -                -             -                             -         -                         -
ns/bad             failed     -       -                -             -                             -         -                         no device fits
ns/theirs          allocated  node-2  gpu.example.com  node-2/gpu-1  -                             -         -                         allocated to node node-2, not this node (node-1)
`},
		{false, &dmv1.ListClaimsResponse{}, "no ResourceClaims concern this node (--all lists every one)\n"},
		{true, &dmv1.ListClaimsResponse{}, "no ResourceClaims\n"},
	} {
		var b bytes.Buffer
		if err := renderClaims(&b, testNow, tc.resp, tc.all); err != nil {
			t.Fatal(err)
		}
		if b.String() != tc.want {
			t.Errorf("claims table (all %v):\n%s\nwant:\n%s", tc.all, b.String(), tc.want)
		}
	}
}

func TestParsePrepare(t *testing.T) {
	req, err := parsePrepare("u1", "default", "p1", []string{"gpu=gpu-claim", "nic=nic-claim"},
		[]string{"main=gpu", "main=nic/fast", "side=gpu/small"})
	if err != nil {
		t.Fatal(err)
	}
	want := &dmv1.PrepareResourcesRequest{PodUid: "u1", PodNamespace: "default", PodName: "p1",
		PodClaims: []*dmv1.PodClaim{{Name: "gpu", ResourceClaimName: "gpu-claim"}, {Name: "nic", ResourceClaimName: "nic-claim"}},
		Containers: []*dmv1.ContainerClaims{
			{Name: "main", Claims: []*dmv1.ContainerClaim{{Name: "gpu"}, {Name: "nic", Request: "fast"}}},
			{Name: "side", Claims: []*dmv1.ContainerClaim{{Name: "gpu", Request: "small"}}},
		}}
	if !proto.Equal(req, want) {
		t.Errorf("request = %v\nwant %v", req, want)
	}
	for _, tc := range []struct {
		claims, containers []string
		uid, want          string
	}{
		{[]string{"a=b"}, []string{"main=a"}, "", "--pod-uid, --namespace and --name are required"},
		{[]string{"a"}, []string{"main=a"}, "u", `--claim "a": want PODCLAIM=CLAIM`},
		{[]string{"a=b", "a=c"}, []string{"main=a"}, "u", `pod claim "a" given twice`},
		{nil, []string{"main=a"}, "u", "at least one --claim"},
		{[]string{"a=b"}, []string{"main"}, "u", `--container "main": want NAME=PODCLAIM[/REQUEST]`},
		{[]string{"a=b"}, []string{"main=x"}, "u", `pod claim "x" is not given with --claim`},
		{[]string{"a=b"}, nil, "u", "at least one --container"},
	} {
		_, err := parsePrepare(tc.uid, "default", "p1", tc.claims, tc.containers)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parsePrepare(%q, %q, %q) = %v, want a usage error with %q", tc.uid, tc.claims, tc.containers, err, tc.want)
		}
	}
}

// fakeClaims serves PrepareResources and ListClaims, recording the
// requests.
type fakeClaims struct {
	dmv1.UnimplementedDRAServiceServer
	prepared chan *dmv1.PrepareResourcesRequest
	listed   chan *dmv1.ListClaimsRequest
}

func (f *fakeClaims) PrepareResources(_ context.Context, req *dmv1.PrepareResourcesRequest) (*dmv1.PrepareResourcesResponse, error) {
	f.prepared <- req
	return &dmv1.PrepareResourcesResponse{Containers: []*dmv1.ContainerResources{
		{Name: "main", CdiDeviceIds: []string{"example.com/gpu=u1-gpu-0"}, Devices: []*dmv1.PreparedDevice{{
			ClaimNamespace: "default", ClaimName: "gpu-claim", ClaimUid: "u1", Requests: []string{"gpu"},
			Driver: "gpu.example.com", Pool: "node-1", Device: "gpu-0", CdiDeviceIds: []string{"example.com/gpu=u1-gpu-0"},
		}}},
		{Name: "side"},
	}}, nil
}

func (f *fakeClaims) ListClaims(_ context.Context, req *dmv1.ListClaimsRequest) (*dmv1.ListClaimsResponse, error) {
	f.listed <- req
	return &dmv1.ListClaimsResponse{Claims: []*dmv1.Claim{{Namespace: req.GetNamespace(), Name: "gpu-claim", State: dmv1.ClaimState_CLAIM_STATE_ALLOCATED}}}, nil
}

func TestPrepareAndClaimsAgainstGRPCServer(t *testing.T) {
	f := &fakeClaims{prepared: make(chan *dmv1.PrepareResourcesRequest, 2), listed: make(chan *dmv1.ListClaimsRequest, 2)}
	sock := serveFake(t, func(s *grpc.Server) { dmv1.RegisterDRAServiceServer(s, f) })
	code, out, errOut := runCLI(t, "--dramanager-addr", sock, "prepare", "--pod-uid", "pod-1", "--namespace", "default", "--name", "p1",
		"--claim", "gpu=gpu-claim", "--container", "main=gpu", "--container", "side=gpu/gpu")
	if code != 0 {
		t.Fatalf("prepare: exit %d: %s", code, errOut)
	}
	req := <-f.prepared
	if req.GetPodUid() != "pod-1" || len(req.GetContainers()) != 2 || req.GetContainers()[1].GetClaims()[0].GetRequest() != "gpu" {
		t.Errorf("request sent = %v", req)
	}
	want := `CONTAINER  CDI DEVICE IDS            DEVICES
main       example.com/gpu=u1-gpu-0  default/gpu-claim:gpu.example.com:node-1/gpu-0
side       -                         -
`
	if out != want {
		t.Errorf("prepare output:\n%s\nwant:\n%s", out, want)
	}
	code, out, _ = runCLI(t, "--dramanager-addr", sock, "prepare", "-o", "json", "--pod-uid", "pod-1", "--namespace", "default", "--name", "p1",
		"--claim", "gpu=gpu-claim", "--container", "main=gpu")
	<-f.prepared
	var resp struct {
		Containers []struct {
			Name         string
			CdiDeviceIds []string
		}
	}
	if err := json.Unmarshal([]byte(out), &resp); code != 0 || err != nil || len(resp.Containers) != 2 || resp.Containers[0].CdiDeviceIds[0] != "example.com/gpu=u1-gpu-0" {
		t.Errorf("prepare JSON (exit %d) %s: %v", code, out, err)
	}
	code, out, errOut = runCLI(t, "--dramanager-addr", sock, "claims", "--namespace", "team")
	if code != 0 || !strings.Contains(out, "team/gpu-claim  allocated") {
		t.Errorf("claims: exit %d: %s%s", code, out, errOut)
	}
	if req := <-f.listed; req.GetNamespace() != "team" || req.GetAll() {
		t.Errorf("claims sent %v, want namespace team without all", req)
	}
	code, out, errOut = runCLI(t, "--dramanager-addr", sock, "claims", "--all")
	if code != 0 || !strings.Contains(out, "NODE") {
		t.Errorf("claims --all: exit %d: %s%s", code, out, errOut)
	}
	if req := <-f.listed; req.GetNamespace() != "" || !req.GetAll() {
		t.Errorf("claims --all sent %v, want all", req)
	}
}
