package main

import (
	"context"
	"maps"
	"os"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	devicemanagerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
)

// fakeDRA is the dramanager's DRAService over the fake devicemanager's
// in-memory table of DRA driver instances (fakeDM.dra), served on the
// fake's socket beside DeviceManagerService and sharing its instance ID
// and restarts (the reconciler dials it as its dramanager too). Its rules are the proto's and the
// devicemanager's DRA registry's: an endpoint with no file is refused
// UNAVAILABLE (the registry cannot dial it; the fake dials nothing);
// instances are keyed by driver name and endpoint; the same generation
// again is a no-op, a new one replaces the instance; a deregistration must
// name the generation it removes.
type fakeDRA struct {
	devicemanagerv1.UnimplementedDRAServiceServer
	d *fakeDM
}

// draInstance is one DRA driver instance the fake devicemanager holds.
type draInstance struct {
	driver, endpoint, socketPath, generation string
	services                                 []string
}

func draKey(driver, endpoint string) string { return driver + "\x00" + endpoint }

// wirePath is the path a request carries in a string and its bytes twin.
func wirePath(text string, b []byte) string {
	p, err := bounds.PathFromWire(text, b)
	if err != nil {
		return text
	}
	return p
}

func (f *fakeDRA) RegisterDRADriver(ctx context.Context, r *devicemanagerv1.RegisterDRADriverRequest) (*devicemanagerv1.RegisterDRADriverResponse, error) {
	d := f.d
	d.mu.Lock()
	defer d.mu.Unlock()
	endpoint := wirePath(r.GetEndpoint(), r.GetEndpointBytes())
	d.draCalls = append(d.draCalls, "register "+r.GetDriverName()+" "+endpoint+" "+r.GetGeneration())
	if d.draRegisterErr != nil {
		return nil, d.draRegisterErr
	}
	if r.GetDriverName() == "" || endpoint == "" || r.GetGeneration() == "" || len(r.GetServices()) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "driver name, endpoint, services and generation are required: %v", r)
	}
	if _, err := os.Lstat(endpoint); err != nil {
		return nil, status.Errorf(codes.Unavailable, "DRA driver %s: endpoint %s: %v", r.GetDriverName(), endpoint, err)
	}
	in := draInstance{driver: r.GetDriverName(), endpoint: endpoint, socketPath: wirePath(r.GetSocketPath(), r.GetSocketPathBytes()),
		generation: r.GetGeneration(), services: slices.Clone(r.GetServices())}
	d.dra[draKey(in.driver, in.endpoint)] = in
	return &devicemanagerv1.RegisterDRADriverResponse{InstanceId: d.instance, Instance: in.proto()}, nil
}

func (f *fakeDRA) DeregisterDRADriver(_ context.Context, r *devicemanagerv1.DeregisterDRADriverRequest) (*devicemanagerv1.DeregisterDRADriverResponse, error) {
	d := f.d
	d.mu.Lock()
	defer d.mu.Unlock()
	endpoint := wirePath(r.GetEndpoint(), r.GetEndpointBytes())
	d.draCalls = append(d.draCalls, "deregister "+r.GetDriverName()+" "+endpoint+" "+r.GetGeneration())
	if r.GetGeneration() == "" {
		return nil, status.Error(codes.InvalidArgument, "generation is required")
	}
	k := draKey(r.GetDriverName(), endpoint)
	in, ok := d.dra[k]
	removed := ok && in.generation == r.GetGeneration()
	if removed {
		delete(d.dra, k)
	}
	return &devicemanagerv1.DeregisterDRADriverResponse{InstanceId: d.instance, Removed: removed}, nil
}

func (f *fakeDRA) ListDRADrivers(_ context.Context, r *devicemanagerv1.ListDRADriversRequest) (*devicemanagerv1.ListDRADriversResponse, error) {
	d := f.d
	d.mu.Lock()
	defer d.mu.Unlock()
	d.draLists++
	byName := map[string]*devicemanagerv1.DRADriver{}
	for _, k := range slices.Sorted(maps.Keys(d.dra)) {
		in := d.dra[k]
		if r.GetDriverName() != "" && r.GetDriverName() != in.driver {
			continue
		}
		drv := byName[in.driver]
		if drv == nil {
			drv = &devicemanagerv1.DRADriver{Name: in.driver}
			byName[in.driver] = drv
		}
		drv.Instances = append(drv.Instances, in.proto())
	}
	resp := &devicemanagerv1.ListDRADriversResponse{InstanceId: d.instance}
	for _, n := range slices.Sorted(maps.Keys(byName)) {
		resp.Drivers = append(resp.Drivers, byName[n])
	}
	return resp, nil
}

func (in draInstance) proto() *devicemanagerv1.DRADriverInstance {
	service := ""
	if len(in.services) > 0 {
		service = in.services[0]
	}
	return &devicemanagerv1.DRADriverInstance{
		DriverName: in.driver, Endpoint: bounds.PathText(in.endpoint), EndpointBytes: bounds.PathBytes(in.endpoint),
		SocketPath: bounds.PathText(in.socketPath), SocketPathBytes: bounds.PathBytes(in.socketPath),
		Generation: in.generation, OfferedServices: in.services, Service: service, RegisteredTime: timestamppb.Now(),
	}
}

// DRAInstances returns the DRA driver instances held, keyed by endpoint.
func (d *fakeDM) DRAInstances() map[string]draInstance {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]draInstance{}
	for _, in := range d.dra {
		out[in.endpoint] = in
	}
	return out
}

// DRACalls returns the DRAService calls made, in order.
func (d *fakeDM) DRACalls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.draCalls)
}

// SetDRARegisterError makes RegisterDRADriver fail with err (nil: succeed).
func (d *fakeDM) SetDRARegisterError(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.draRegisterErr = err
}

// AddDRAInstance records an instance as an earlier reconciler's
// registration would have.
func (d *fakeDM) AddDRAInstance(in draInstance) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dra[draKey(in.driver, in.endpoint)] = in
}

// WatchResourceSlices sends the synced marker with the instance ID, as the
// dramanager's stream starts, and ends when the fake restarts.
func (f *fakeDRA) WatchResourceSlices(_ *devicemanagerv1.WatchResourceSlicesRequest, srv grpc.ServerStreamingServer[devicemanagerv1.WatchResourceSlicesResponse]) error {
	d := f.d
	d.mu.Lock()
	id, stop := d.instance, d.stop
	d.mu.Unlock()
	if err := srv.Send(&devicemanagerv1.WatchResourceSlicesResponse{InstanceId: id, Item: &devicemanagerv1.WatchResourceSlicesResponse_Synced{Synced: &devicemanagerv1.Synced{}}}); err != nil {
		return err
	}
	select {
	case <-stop:
		return status.Error(codes.Unavailable, "dramanager restarting")
	case <-srv.Context().Done():
		return srv.Context().Err()
	}
}
