package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
)

func TestRenderSlicesAndDRAInstances(t *testing.T) {
	var b bytes.Buffer
	err := renderSlices(&b, testNow, &dmv1.ListResourceSlicesResponse{Slices: []*dmv1.ResourceSlice{
		{Name: "node-1-gpu.example.com-abcde", Driver: "gpu.example.com", Pool: &dmv1.ResourcePool{Name: "node-1", Generation: 2, ResourceSliceCount: 1},
			CreationTime: ts(-time.Minute), Devices: []*dmv1.Device{
				{Name: "gpu-0", Attributes: map[string]string{"model": "m1", "index": "0"}, Capacity: map[string]string{"memory": "16Gi"},
					Health: "Unhealthy", HealthMessage: "ECC errors"},
				{Name: "gpu-1"},
			}},
		{Name: "empty", Driver: "nic.example.com", Pool: &dmv1.ResourcePool{Name: "p"}, CreationTime: ts(-2 * time.Second)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := `DRIVER           POOL    GENERATION  SLICES  SLICE                         DEVICE  HEALTH                  ATTRIBUTES        CAPACITY     AGE
gpu.example.com  node-1  2           1       node-1-gpu.example.com-abcde  gpu-0   Unhealthy (ECC errors)  index=0,model=m1  memory=16Gi  1m
gpu.example.com  node-1  2           1       node-1-gpu.example.com-abcde  gpu-1   -                       -                 -            1m
nic.example.com  p       0           0       empty                         -       -                       -                 -            2s
`
	if b.String() != want {
		t.Errorf("slices table:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	err = renderDRAInstances(&b, testNow, &dmv1.ListDRADriversResponse{Drivers: []*dmv1.DRADriver{
		{Name: "gpu.example.com", Instances: []*dmv1.DRADriverInstance{
			{Endpoint: "/r/plugins/gpu/dra-1.sock", Service: "v1.DRAPlugin", ConnectionState: "TRANSIENT_FAILURE", RegisteredTime: ts(-time.Hour), LastError: "connection refused"},
			{Endpoint: "/r/plugins/gpu/dra-2.sock", Service: "v1.DRAPlugin", ConnectionState: "READY", Serving: true, HealthServiceName: "v1.DRAResourceHealth", RegisteredTime: ts(-time.Minute)},
		}},
		{Name: "gone.example.com", SliceDeletionTime: ts(20 * time.Second)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want = `DRA DRIVER        ENDPOINT                   SERVICE       CONNECTION         SERVING  HEALTH                AGE  SLICES DELETED  LAST ERROR
gpu.example.com   /r/plugins/gpu/dra-1.sock  v1.DRAPlugin  transient_failure  no       -                     1h   -               connection refused
gpu.example.com   /r/plugins/gpu/dra-2.sock  v1.DRAPlugin  ready              yes      v1.DRAResourceHealth  1m   -               -
gone.example.com  -                          -             no instance        -        -                     -    in 20s          -
`
	if b.String() != want {
		t.Errorf("DRA instances table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// fakeDRA serves the reconciler's ListDrivers and the devicemanager's
// DRAService lists, recording the driver filter it was asked for.
type fakeDRA struct {
	reconcilerv1.UnimplementedReconcilerServiceServer
	dmv1.UnimplementedDRAServiceServer
	asked chan string
}

func (f *fakeDRA) ListDrivers(context.Context, *reconcilerv1.ListDriversRequest) (*reconcilerv1.ListDriversResponse, error) {
	return &reconcilerv1.ListDriversResponse{DraDrivers: []*reconcilerv1.DRADriver{{Name: "gpu.example.com", Endpoint: "/r/dra.sock"}}}, nil
}

func (f *fakeDRA) ListDRADrivers(context.Context, *dmv1.ListDRADriversRequest) (*dmv1.ListDRADriversResponse, error) {
	return &dmv1.ListDRADriversResponse{Drivers: []*dmv1.DRADriver{{Name: "gpu.example.com", Instances: []*dmv1.DRADriverInstance{
		{DriverName: "gpu.example.com", Endpoint: "/r/dra.sock", ConnectionState: "READY", Connected: true, Serving: true},
	}}}}, nil
}

func (f *fakeDRA) ListResourceSlices(_ context.Context, req *dmv1.ListResourceSlicesRequest) (*dmv1.ListResourceSlicesResponse, error) {
	f.asked <- req.GetDriverName()
	return &dmv1.ListResourceSlicesResponse{Slices: []*dmv1.ResourceSlice{{Name: "s1", Driver: "gpu.example.com", Pool: &dmv1.ResourcePool{Name: "p"}}}}, nil
}

func TestSlicesAndDriversAgainstGRPCServer(t *testing.T) {
	f := &fakeDRA{asked: make(chan string, 4)}
	sock := serveFake(t, func(s *grpc.Server) {
		reconcilerv1.RegisterReconcilerServiceServer(s, f)
		dmv1.RegisterDRAServiceServer(s, f)
	})
	code, out, errOut := runCLI(t, "--dramanager-addr", sock, "slices", "--driver", "gpu.example.com", "-o", "json")
	if code != 0 {
		t.Fatalf("slices: exit %d: %s", code, errOut)
	}
	if got := <-f.asked; got != "gpu.example.com" {
		t.Errorf("driver filter sent = %q", got)
	}
	var resp struct {
		Slices []struct{ Name, Driver string }
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Slices) != 1 || resp.Slices[0].Name != "s1" {
		t.Errorf("slices JSON %q: %v", out, err)
	}

	code, out, errOut = runCLI(t, "--reconciler-addr", sock, "--dramanager-addr", sock, "drivers")
	if code != 0 || errOut != "" {
		t.Fatalf("drivers: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "DRA DRIVER       VERSIONS") || !strings.Contains(out, "/r/dra.sock  -        ready       yes") {
		t.Errorf("drivers table:\n%s", out)
	}
	code, out, _ = runCLI(t, "--reconciler-addr", sock, "--dramanager-addr", sock, "drivers", "-o", "json")
	var doc struct {
		DraDrivers           []struct{ Name string }
		DraDriverConnections []struct {
			Name      string
			Instances []struct{ Serving bool }
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.DraDrivers) != 1 ||
		len(doc.DraDriverConnections) != 1 || len(doc.DraDriverConnections[0].Instances) != 1 || !doc.DraDriverConnections[0].Instances[0].Serving {
		t.Errorf("drivers JSON (exit %d) %s: %v", code, out, err)
	}
}
